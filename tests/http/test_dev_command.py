"""`quota-ledger dev` on a machine with nothing configured: it starts embedded Postgres and Redis,
migrates, prints keys, serves, answers a take, and stops cleanly on Ctrl-C."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.http.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


def _call(method: str, url: str, key: str | None = None, body: object = None) -> tuple[int, object]:
    req = urllib.request.Request(url, method=method, data=None if body is None else json.dumps(body).encode())
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _wait_until_up(base: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            if _call("GET", f"{base}/healthz")[0] == 200:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    raise AssertionError("the dev server never answered /healthz")


def dev_process(env: dict[str, str], port: int) -> subprocess.Popen[str]:
    """`quota-ledger dev` on `port`, its output (stdout and stderr) in a text pipe."""
    return subprocess.Popen(
        [sys.executable, "-m", "service.cli", "dev", "--bind", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, so Ctrl-C can be sent the way a terminal does
    )


@pytest.mark.slow
def test_dev_starts_from_nothing_and_answers_a_take(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "PLANS_FILE")}
    env["QUOTA_DEV_DIR"] = str(tmp_path / "dev")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = dev_process(env, port)
    lines: queue.Queue[str] = queue.Queue()
    output: list[str] = []
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
    try:
        deadline = time.monotonic() + 180
        product_key = None
        while product_key is None:
            assert time.monotonic() < deadline, "no product key printed:\n" + "".join(output)
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                assert proc.poll() is None, "dev exited early:\n" + "".join(output)
                continue
            output.append(line)
            m = re.match(r"\s*product key:\s+(\S+)\s*$", line)
            if m:
                product_key = m.group(1)
        assert "DATABASE_URL" not in env and "embedded Postgres" in "".join(output)
        _wait_until_up(base, deadline)

        status, body = _call("PUT", f"{base}/v1/accounts/dev-acc", product_key, {"kind": "user"})
        assert status == 201, body
        status, body = _call("POST", f"{base}/v1/accounts/dev-acc/takes", product_key, {"metric": "urls"})
        assert status == 201, body
        assert body["used"] == 1 and body["limit_source"] == "plan"  # type: ignore[index]

        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 0, "".join(output)
        with pytest.raises(OSError):
            _call("GET", f"{base}/healthz")
        time.sleep(1)
        with pytest.raises(ProcessLookupError):  # nothing of it is left running
            os.killpg(proc.pid, 0)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _start_dev(env: dict[str, str], port: int) -> tuple[subprocess.Popen[str], str, list[str]]:
    """`dev` started and its product key printed; returns the process, the key and the output."""
    proc = dev_process(env, port)
    output: list[str] = []
    deadline = time.monotonic() + 60
    for line in proc.stdout:  # type: ignore[union-attr]
        output.append(line)
        m = re.match(r"\s*product key:\s+(\S+)\s*$", line)
        if m:
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # type: ignore[union-attr]
            return proc, m.group(1), output
        assert time.monotonic() < deadline, "".join(output)
    raise AssertionError("dev printed no product key:\n" + "".join(output))


@pytest.mark.slow
def test_dev_runs_as_the_login_role_and_keeps_three_keys_over_restarts(db_url, redis_url, conn, tmp_path):
    from tests.workers.conftest import worker_redis_url

    env = {k: v for k, v in os.environ.items() if k not in ("PLANS_FILE", "WEBHOOK_ENVIRONMENT")}
    env.update(DATABASE_URL=db_url, REDIS_URL=worker_redis_url(redis_url), QUOTA_DEV_DIR=str(tmp_path))
    env["WORKER_QUEUE"] = f"test-dev-{os.getpid()}-{time.monotonic_ns()}"  # never another run's tasks
    for start in range(2):
        port = free_port()
        proc, key, output = _start_dev(env, port)
        try:
            assert "WEBHOOK_ENVIRONMENT=any" in "".join(output)  # dev says what it applies
            base = f"http://127.0.0.1:{port}"
            _wait_until_up(base, time.monotonic() + 60)
            assert _call("PUT", f"{base}/v1/accounts/dev-{start}", key, {"kind": "user"})[0] == 201
            # dev makes a console key for the run and says where the console is
            assert f"{base}/console" in "".join(output)
            with urllib.request.urlopen(f"{base}/console/login", timeout=10) as page:
                assert page.status == 200 and b'name="api_key"' in page.read()
            users = conn.execute(
                "SELECT DISTINCT usename FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name = 'quota-ledger'"
            ).fetchall()
            assert users == [("quota_dev",)]  # the web pool, as the login role
            # the relay, as the one role that may read the endpoints' signing secrets
            relay_users: list[tuple[str]] = []
            deadline = time.monotonic() + 30
            while not relay_users and time.monotonic() < deadline:
                relay_users = conn.execute(
                    "SELECT DISTINCT usename FROM pg_stat_activity"
                    " WHERE datname = current_database() AND application_name = 'quota-ledger-relay'"
                ).fetchall()
                time.sleep(0.2)
            assert relay_users == [("quota_dev_relay",)]
            os.killpg(proc.pid, signal.SIGINT)
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
    keys = conn.execute("SELECT name, revoked_at FROM api_keys ORDER BY name").fetchall()
    assert keys == [("dev-admin", None), ("dev-finance", None), ("dev-product", None)]
    import redis

    r = redis.Redis.from_url(env["REDIS_URL"])  # leave nothing of this queue in the shared Redis db
    for name in r.scan_iter(match=f"*{env['WORKER_QUEUE']}*"):
        r.delete(name)
    r.close()
