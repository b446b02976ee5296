"""Server-side cost of a webhook delivery: the statement of data-modifying CTEs it was
(bench/deliver_before.sql) against billing_deliver, the function it is, on one PostgreSQL, in the
same database, alternating batches.

    DATABASE_URL=... .venv/bin/python bench/deliver_ab.py [--batches 9] [--batch 1000] [--change-rate 1.0]

Creates the scratch database bench_deliver_ab, seeded as bench/webhooks.py seeds bench_wh (accounts on
Basic, each with an active Stripe subscription, its inbox row and customer link). Each side has a
connection of its own in autocommit, as the service's delivery runs; every delivery is a new event,
newer than anything stored, for a random account (bench/webhooks.py's Deliveries: --change-rate of
them change the account's tier or status). Reports, per batch and as medians: the backend's CPU per
delivery (/proc of the connection's server process, so the server must run on this machine), the
wall time per delivery seen by the client, and the ratio function / statement. Run by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import psycopg  # noqa: E402
from webhooks import PLANS_FILE, Deliveries, setup  # noqa: E402

from service.billing.apply import deliver_params  # noqa: E402
from service.billing.events import Envelope, SubscriptionChange  # noqa: E402
from service.db import Positional, Q  # noqa: E402
from service.plans import load_plans  # noqa: E402
from service.webhooks import stripe  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def backend_cpu(pid: int) -> float:
    """Seconds of CPU (user + system) the server process `pid` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def statement_before() -> Positional:
    text = (HERE / "deliver_before.sql").read_text()
    return Positional.of(text[text.index("-- name: subscription_delivery_before") :])


def functions_before() -> str:
    text = (HERE / "deliver_before.sql").read_text()
    return text[: text.index("-- name: subscription_delivery_before")]


class Events(Deliveries):
    """Parameters of new deliveries, each newer than every one before (bench/webhooks.py)."""

    def __init__(self, accounts: int, change_rate: float) -> None:
        super().__init__(accounts, change_rate, prefix="evt_ab")
        self.plans = load_plans(PLANS_FILE)

    def next(self) -> dict[str, Any]:
        body = self.next_body()
        event = json.loads(body)
        env = Envelope(
            provider="stripe",
            event_id=event["id"],
            type=event["type"],
            occurred_at=datetime.fromtimestamp(self.created, UTC),
            body=body,
            data=event,
        )
        change = stripe.translate(env)
        assert isinstance(change, SubscriptionChange)
        params = deliver_params(
            self.plans,
            env,
            change,
            actor=f"webhook:stripe:{env.event_id}",
            store=True,
            locked=False,
            account_id=change.account_ids[0],
            resolved=False,
        )
        return {**params, "link_customer_id": params["customer_id"]}


def run(conn: psycopg.Connection[Any], query: Positional, batch: list[dict[str, Any]]) -> tuple[float, float]:
    pid = conn.info.backend_pid
    cpu, wall = backend_cpu(pid), time.perf_counter()
    with psycopg.RawCursor(conn) as cur:
        for params in batch:
            row = query.execute(cur, params).fetchone()
            assert row is not None and row[1] in ("applied", "ignored"), row
    return (backend_cpu(pid) - cpu) / len(batch) * 1e3, (time.perf_counter() - wall) / len(batch) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=9, help="alternations (each: one batch of each side)")
    ap.add_argument("--batch", type=int, default=1000, help="deliveries per batch")
    ap.add_argument("--accounts", type=int, default=10_000)
    ap.add_argument("--change-rate", type=float, default=1.0)
    ap.add_argument("--db", default="bench_deliver_ab")
    args = ap.parse_args()
    db, _ = setup(os.environ["DATABASE_URL"], args.accounts, db=args.db)
    sides = {"statement": statement_before(), "function": Positional.of(Q.billing_deliver)}
    events = Events(args.accounts, args.change_rate)
    with psycopg.connect(db, autocommit=True) as setup_conn:
        setup_conn.execute(functions_before())
    conns = {name: psycopg.connect(db, autocommit=True) for name in sides}
    try:
        for name, query in sides.items():  # warm-up: plans cached, pages read
            run(conns[name], query, [events.next() for _ in range(200)])
        got: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
        for i in range(args.batches):
            order = list(sides) if i % 2 == 0 else list(reversed(sides))
            for name in order:
                got[name].append(run(conns[name], sides[name], [events.next() for _ in range(args.batch)]))
            s, f = got["statement"][-1], got["function"][-1]
            print(
                f"batch {i + 1}: statement cpu {s[0]:.3f} ms wall {s[1]:.3f} ms | "
                f"function cpu {f[0]:.3f} ms wall {f[1]:.3f} ms | "
                f"ratio cpu {f[0] / s[0]:.2f} wall {f[1] / s[1]:.2f}",
                flush=True,
            )
        for k, what in ((0, "backend CPU"), (1, "wall")):
            s = statistics.median(x[k] for x in got["statement"])
            f = statistics.median(x[k] for x in got["function"])
            ratios = statistics.median(
                b[k] / a[k] for a, b in zip(got["statement"], got["function"], strict=True)
            )
            print(
                f"median {what} per delivery: statement {s:.3f} ms, function {f:.3f} ms; "
                f"ratio per batch {ratios:.2f}"
            )
    finally:
        for c in conns.values():
            c.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
