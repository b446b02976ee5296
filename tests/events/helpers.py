"""Events for the relay to deliver, written as the causing transaction would (as the owner: the
service's role cannot write an event), and a real local HTTP receiver."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psycopg

from service.events import endpoints

# A sample payload of each type, as the issue names their fields (occurred_at added by `emit`).
SAMPLES: dict[str, dict[str, Any]] = {
    "quota.threshold_crossed": {
        "account_id": "acc-1",
        "metric": "urls",
        "period": "2026-12",
        "threshold": 80,
        "used": 8,
        "limit": 10,
    },
    "account.plan_changed": {
        "account_id": "acc-1",
        "previous": {"plan": "free", "status": "none"},
        "current": {"plan": "pro", "status": "active"},
        "cause": "stripe",
    },
    "credits.granted": {"account_id": "acc-1", "grant_id": 1, "metric": "urls", "units": 100},
    "credits.voided": {"account_id": "acc-1", "grant_id": 1, "metric": "urls", "forfeited": 40},
}
ALL_TYPES = list(SAMPLES)


def emit(
    conn: psycopg.Connection[Any], type: str = "quota.threshold_crossed", account_id: str = "acc-1"
) -> int:
    """One event in event_outbox, committed (or in the caller's open transaction); returns its id."""
    data = {
        **SAMPLES[type],
        "account_id": account_id,
        "occurred_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    }
    row = conn.execute(
        "INSERT INTO event_outbox (account_id, type, data) VALUES (%s, %s, %s) RETURNING id",
        (account_id, type, json.dumps(data)),
    ).fetchone()
    assert row is not None
    return int(row[0])


def add_endpoint(
    conn: psycopg.Connection[Any], url: str, events: list[str] | None = None
) -> endpoints.NewSecret:
    return endpoints.create(conn, url=url, events=events or ALL_TYPES, allow_private=True, actor="test")


def delivery(conn: psycopg.Connection[Any], event_id: int, endpoint_id: str) -> dict[str, Any]:
    cur = conn.cursor(row_factory=psycopg.rows.dict_row)
    row = cur.execute(
        "SELECT * FROM webhook_deliveries WHERE event_id = %s AND endpoint_id = %s", (event_id, endpoint_id)
    ).fetchone()
    assert row is not None, f"no delivery of {event_id} to {endpoint_id}"
    return row


class Receiver:
    """An HTTP server on 127.0.0.1 that records every POST (headers, body) and answers each with the
    next of `answers` (then 200). `hold` set: each request waits until it is cleared (`release`)."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.answers: list[int | tuple[int, dict[str, str]]] = []
        self.hold = False
        self._released = threading.Event()
        self.arrived = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver.arrived:
                    receiver.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                    answer = receiver.answers.pop(0) if receiver.answers else 200
                    receiver.arrived.notify_all()
                if receiver.hold:
                    receiver._released.wait(30)
                status, headers = answer if isinstance(answer, tuple) else (answer, {})
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def wait_for(
        self, n: int, timeout: float = 20.0, where: Callable[[dict[str, str]], bool] | None = None
    ) -> None:
        """Until `n` requests (matching `where`) have arrived."""

        def count() -> int:
            return sum(1 for h, _ in self.requests if where is None or where(h))

        with self.arrived:
            assert self.arrived.wait_for(lambda: count() >= n, timeout), f"{count()} of {n} requests arrived"

    def release(self) -> None:
        self.hold = False
        self._released.set()

    def ids(self) -> list[str]:
        return [h["webhook-id"] for h, _ in self.requests]

    def close(self) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()
