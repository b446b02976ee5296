"""A database outage under load, against a real `quota-ledger serve` and a private Postgres that is
stopped and started: how fast requests are refused while it is down, and how fast service resumes.
Used by tests/faults/test_database_outage.py (short, with bounds) and bench/outage.py (figures)."""

from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from service.keys import create_key
from service.migrate import migrate
from service.plans import load_plans
from service.quota.accounts import upsert_account
from service.quota.overrides import set_override
from tests.servers import PrivatePostgres

ACCOUNT = "acc-outage"
PLANS_FILE = Path(__file__).resolve().parents[1] / "plans.toml"


def prepare(database_url: str) -> dict[str, str]:
    """Migrate, and make a product key and ACCOUNT (unlimited api_calls, so no take is refused);
    returns the key's Authorization header."""
    migrate(database_url)
    plans = load_plans(PLANS_FILE)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("DELETE FROM api_keys WHERE name = 'outage'")
        key = create_key(conn, name="outage", role="product")
        upsert_account(conn, plans, account_id=ACCOUNT, kind="user")
        set_override(conn, plans, account_id=ACCOUNT, metric="api_calls", limit=None, actor="outage")
    return {"Authorization": f"Bearer {key}"}


def serve_env(database_url: str, redis_url: str, **extra: Any) -> dict[str, str]:
    return {
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "PLANS_FILE": str(PLANS_FILE),
        "KEY_CACHE_SECONDS": "0",  # every request needs the database, as an uncached key would
        "WEBHOOK_ENVIRONMENT": "any",  # serve refuses to start without it; no webhook is sent here
        **{k: str(v) for k, v in extra.items()},
    }


@dataclass(frozen=True)
class Call:
    path: str
    started: float
    took: float
    status: int  # 0: no HTTP answer (timeout, connection refused)
    error: str | None  # the JSON error code, if the body was one


def call(base: str, path: str, *, body: dict[str, Any] | None = None, headers: dict[str, str] | None = None,
         timeout: float = 10.0) -> Call:  # fmt: skip
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        base + path,
        data=data,
        method="POST" if data is not None else "GET",
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    t = time.monotonic()
    status, payload = 0, b""
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, payload = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, payload = e.code, e.read()
    except OSError:
        pass
    took = time.monotonic() - t
    error = None
    if status >= 400:
        try:
            error = json.loads(payload).get("error")
        except (ValueError, AttributeError):
            error = None
    return Call(path, t, took, status, error)


@dataclass
class Outage:
    stopping_at: float = 0.0  # pg_ctl stop called
    down_at: float = 0.0  # the server stopped (pg_ctl stop returned)
    starting_at: float = 0.0  # pg_ctl start called: the server is back from about here on
    up_at: float = 0.0  # pg_ctl start returned (the server accepted connections a little earlier)
    calls: list[Call] = field(default_factory=list)

    def takes(self, lo: float, hi: float) -> list[Call]:
        return [c for c in self.calls if c.path != "/readyz" and lo <= c.started < hi]

    def readyz(self, lo: float, hi: float) -> list[Call]:
        """/readyz probes that started and were answered within [lo, hi)."""
        return [c for c in self.calls if c.path == "/readyz" and lo <= c.started and c.started + c.took < hi]

    @property
    def before(self) -> list[Call]:
        """Takes answered before the server was being stopped."""
        return [c for c in self.takes(0.0, self.stopping_at) if c.started + c.took < self.stopping_at]

    @property
    def during(self) -> list[Call]:
        """Takes that started and were answered while the server was down."""
        return [
            c for c in self.takes(self.down_at, self.starting_at) if c.started + c.took < self.starting_at
        ]

    def _answered_after_start(self, ok: bool) -> list[float]:
        return [
            c.started + c.took - self.starting_at
            for c in self.takes(self.down_at, float("inf"))
            if c.started + c.took > self.starting_at and (c.status < 300) == ok
        ]

    @property
    def first_success_after(self) -> float | None:
        """Seconds from `pg_ctl start` (which includes the server's own start-up) to the first take
        answered with success."""
        ok = self._answered_after_start(True)
        return min(ok) if ok else None

    @property
    def last_failure_after(self) -> float:
        """Seconds from `pg_ctl start` to the last take answered with a failure (0: none)."""
        return max(self._answered_after_start(False), default=0.0)

    def summary(self) -> dict[str, Any]:
        during = sorted(c.took for c in self.during)
        ready = [c.took for c in self.readyz(self.down_at, self.starting_at)]
        return {
            "outage_s": round(self.up_at - self.down_at, 1),
            "takes_during": len(during),
            "statuses_during": sorted({c.status for c in self.during}),
            "not_503_json_during": sum(c.status != 503 or c.error != "unavailable" for c in self.during),
            "take_latency_during_median_s": round(statistics.median(during), 3) if during else None,
            "take_latency_during_p99_s": round(during[int(0.99 * (len(during) - 1))], 3) if during else None,
            "take_latency_during_max_s": round(max(during), 3) if during else None,
            "readyz_during_max_s": round(max(ready), 3) if ready else None,
            "first_success_after_s": (
                round(self.first_success_after, 2) if self.first_success_after is not None else None
            ),
            "last_failure_after_s": round(self.last_failure_after, 2),
        }


def run_outage(
    pg: PrivatePostgres,
    base: str,
    *,
    headers: dict[str, str],
    account: str,
    outage_seconds: float,
    clients: int = 4,
    warm_seconds: float = 1.0,
    settle_seconds: float = 2.0,
    recovery_timeout: float = 30.0,
) -> Outage:
    """`clients` threads take units of `account` back to back and one probes /readyz every 0.2 s;
    the server is stopped (fast: every session ends) for `outage_seconds`, then started; the load
    goes on until `settle_seconds` after the first success (or `recovery_timeout`)."""
    inf = float("inf")
    out = Outage(stopping_at=inf, down_at=inf, starting_at=inf, up_at=inf)
    stop = threading.Event()
    lock = threading.Lock()

    def record(c: Call) -> None:
        with lock:
            out.calls.append(c)

    def taker() -> None:
        while not stop.is_set():
            record(call(base, f"/v1/accounts/{account}/takes", body={"metric": "api_calls"}, headers=headers))

    def prober() -> None:
        while not stop.is_set():
            record(call(base, "/readyz", timeout=10.0))
            stop.wait(0.2)

    threads = [threading.Thread(target=taker) for _ in range(clients)] + [threading.Thread(target=prober)]
    for t in threads:
        t.start()
    try:
        time.sleep(warm_seconds)
        out.stopping_at = time.monotonic()
        pg.stop("fast")
        out.down_at = time.monotonic()
        time.sleep(outage_seconds)
        out.starting_at = time.monotonic()
        pg.start()
        out.up_at = time.monotonic()
        deadline = out.up_at + recovery_timeout
        while time.monotonic() < deadline and out.first_success_after is None:
            time.sleep(0.05)
        time.sleep(settle_seconds)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    return out
