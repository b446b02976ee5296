"""`quota-ledger dev` against the machine's PostgreSQL and Redis: the banner comes last, once web,
worker and beat answer, with the children's output in the log file; one Ctrl-C (or two in quick
succession) stops every process it started and frees the port within a few seconds, every time;
so does `dev`'s own death."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from tests.http.conftest import free_port
from tests.http.test_dev_command import dev_process

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 5  # then one more in which dev itself is killed
STOPPED_WITHIN = 8.0  # seconds; dev gives its children 5 before it kills them


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@pytest.mark.slow
def test_one_ctrl_c_stops_everything_every_time(db_url, redis_url, tmp_path):
    from tests.workers.conftest import worker_redis_url

    env = {k: v for k, v in os.environ.items() if k not in ("PLANS_FILE", "WEBHOOK_ENVIRONMENT")}
    env.update(DATABASE_URL=db_url, REDIS_URL=worker_redis_url(redis_url), QUOTA_DEV_DIR=str(tmp_path))
    env["WORKER_QUEUE"] = f"test-dev-stop-{os.getpid()}-{time.monotonic_ns()}"
    for round_ in range(ROUNDS + 1):
        port = free_port()
        proc = dev_process(env, port)
        output: list[str] = []
        try:
            threading.Thread(target=output.extend, args=(proc.stdout,), daemon=True).start()
            deadline = time.monotonic() + 120
            while not any("curl -s http" in line and "/v1/accounts/acc_1 -H" in line for line in output):
                assert proc.poll() is None and time.monotonic() < deadline, "".join(output)
                time.sleep(0.2)
            started = _descendants(proc.pid)
            assert len(started) >= 5, started  # web's master and 2 workers, the worker, beat
            time.sleep(1)
            banner = "".join(output)
            # the banner is the last thing printed: nothing of the children's start-up after it
            assert banner.rstrip().endswith(
                f"curl -s http://127.0.0.1:{port}/v1/accounts/acc_1 -H "
                f"'Authorization: Bearer {banner.split('product key:')[1].split()[0]}'"
            )
            assert "Spawning worker" not in banner and "celery beat" not in banner.lower()
            log = tmp_path / "dev.log"
            assert f"log:      {log}" in banner
            assert "Listening at: http://127.0.0.1:" in log.read_text()  # the server's lines are there
            assert "STRIPE_WEBHOOK_SECRETS=" in banner and "REVENUECAT_WEBHOOK_AUTH=" in banner

            stop_at = time.monotonic()
            if round_ == ROUNDS:  # dev killed: its children learn of it from the kernel
                proc.kill()
                assert proc.wait(timeout=STOPPED_WITHIN) == -signal.SIGKILL
            else:
                os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C, as a terminal sends it to its foreground job
                if round_ % 2:
                    time.sleep(0.3)
                    os.killpg(proc.pid, signal.SIGINT)  # and a second one, impatiently
                assert proc.wait(timeout=STOPPED_WITHIN) == 0, "".join(output)
            while any(_running(pid) for pid in started) or not _port_free(port):
                assert time.monotonic() - stop_at < STOPPED_WITHIN, (
                    f"round {round_}: left running {[p for p in started if _running(p)]}, "
                    f"port free: {_port_free(port)}\n{log.read_text()[-3000:]}"
                )
                time.sleep(0.1)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
            for pid in _descendants(proc.pid) | (started if "started" in locals() else set()):
                if _running(pid):
                    os.kill(pid, signal.SIGKILL)
    import redis

    r = redis.Redis.from_url(env["REDIS_URL"])
    for name in r.scan_iter(match=f"*{env['WORKER_QUEUE']}*"):
        r.delete(name)
    r.close()
