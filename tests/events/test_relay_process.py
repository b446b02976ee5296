"""`quota-ledger relay` as a process: killed with SIGKILL mid-send, its restart sends the event again
(at least once, the same webhook-id); SIGTERM lets the attempt in flight finish and be recorded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from standardwebhooks import Webhook

from tests.conftest import VIA_PGBOUNCER
from tests.events.helpers import add_endpoint, delivery, emit


def _env(relay_db_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEBHOOK_OUT_")}
    env |= {
        "DATABASE_URL": relay_db_url,
        "WEBHOOK_OUT_ALLOW_PRIVATE": "true",
        "WEBHOOK_OUT_RETRY_SCHEDULE": "0",
    }
    if VIA_PGBOUNCER:
        env["DB_PREPARED_STATEMENTS"] = "off"
    return env


def _relay(relay_db_url: str, log: Path, *args: str) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "service.cli", "relay", "--workers", "1", *args],
            env=_env(relay_db_url),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _relay_once(db_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", "relay", "--once"],
        env=_env(db_url),
        capture_output=True,
        text=True,
        timeout=60,
    )


def _until_its_session_ended(conn) -> None:
    """The killed relay's database session ends (and its lock with it) when the server reads the
    closed socket; a restart that came sooner would skip the still-locked row for now."""
    query = (
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'quota-ledger-relay' "
        "AND datname = current_database()"
    )
    deadline = time.monotonic() + 10
    while conn.execute(query).fetchone()[0] and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_relay_killed_mid_send_delivers_after_restart(conn, relay_db_url, receiver, tmp_path):
    endpoint = add_endpoint(conn, receiver.url)
    event = emit(conn)
    receiver.hold = True
    first = _relay(relay_db_url, tmp_path / "relay.log")
    try:
        receiver.wait_for(1)  # the receiver holds the request: the relay is mid-send
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
    receiver.release()
    _until_its_session_ended(conn)
    assert delivery(conn, event, endpoint.id)["attempts"] == 0  # the attempt was never recorded
    again = _relay_once(relay_db_url)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("1 delivered")
    assert receiver.ids() == [f"evt_{event}"] * 2  # the same webhook-id: the receiver dedupes on it
    for headers, body in receiver.requests:
        Webhook(endpoint.secret).verify(body, headers)
    d = delivery(conn, event, endpoint.id)
    assert (d["status"], d["attempts"]) == ("delivered", 1)


def test_an_event_committed_while_no_relay_runs_is_delivered_when_one_starts(
    conn, relay_db_url, receiver, tmp_path
):
    endpoint = add_endpoint(conn, receiver.url)
    event = emit(conn)
    relay = _relay(relay_db_url, tmp_path / "relay.log")
    try:
        receiver.wait_for(1)
        deadline = time.monotonic() + 10
        while delivery(conn, event, endpoint.id)["status"] != "delivered" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert delivery(conn, event, endpoint.id)["status"] == "delivered"
    finally:
        relay.send_signal(signal.SIGTERM)
        assert relay.wait(20) == 0


def test_sigterm_lets_the_attempt_in_flight_finish(conn, relay_db_url, receiver, tmp_path):
    endpoint = add_endpoint(conn, receiver.url)
    event = emit(conn)
    receiver.hold = True
    log = tmp_path / "relay.log"
    relay = _relay(relay_db_url, log, "--heartbeat", str(tmp_path / "alive"))
    try:
        receiver.wait_for(1)
        relay.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        assert relay.poll() is None  # still waiting for the answer
        receiver.release()
        assert relay.wait(20) == 0
    finally:
        if relay.poll() is None:
            relay.kill()
    assert delivery(conn, event, endpoint.id)["status"] == "delivered"
    assert (tmp_path / "alive").exists()
    assert "relay stopped" in log.read_text()


def test_a_relay_whose_role_may_not_read_the_secrets_refuses_to_start(
    conn, app_db_url, relay_db_url, receiver
):
    """Run as the web process's role (quota_app), the relay says which role to use and sends nothing."""
    add_endpoint(conn, receiver.url)
    emit(conn)
    refused = _relay_once(app_db_url)
    assert refused.returncode == 2, refused.stderr
    assert "quota_ledger_test" in refused.stderr and "quota_relay" in refused.stderr
    assert "--relay-role" in refused.stderr
    assert receiver.requests == []
    done = _relay_once(relay_db_url)
    assert (done.returncode, done.stdout.split(",")[0]) == (0, "1 delivered"), done.stderr


def test_a_running_relay_that_loses_the_secrets_stops_and_says_why(conn, relay_db_url, receiver, tmp_path):
    """An upgrade that took the secrets from the relay's role under a running relay: its claims fail
    while fan-out and the heartbeat would go on looking healthy, so it stops (exit 2), naming the role."""
    add_endpoint(conn, receiver.url)
    log = tmp_path / "relay.log"
    relay = _relay(relay_db_url, log, "--heartbeat", str(tmp_path / "alive"))
    try:
        deadline = time.monotonic() + 20
        while not (tmp_path / "alive").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        conn.execute("REVOKE SELECT (secret, previous_secret) ON webhook_endpoints FROM quota_relay")
        emit(conn)
        assert relay.wait(20) == 2
    finally:
        if relay.poll() is None:
            relay.kill()
    assert "may not read the webhook endpoints' signing secrets" in log.read_text()
    assert receiver.requests == []
