"""`quota-ledger dev` on a machine with nothing configured: it starts embedded Postgres and Redis,
migrates, prints keys, serves, answers a take, and stops cleanly on Ctrl-C."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


@pytest.mark.slow
def test_dev_starts_from_nothing_and_answers_a_take(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "PLANS_FILE")}
    env["QUOTA_DEV_DIR"] = str(tmp_path / "dev")
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "dev", "--bind", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, so Ctrl-C can be sent the way a terminal does
    )
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
