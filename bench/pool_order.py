"""The order in which the pool hands out idle connections: a stack (service/db.py StackPool, the
connection returned last) against psycopg_pool's own queue (the connection idle longest).

    bench/run pool-order [--db bench_ql] [--takes 500] [--reps 6] [--pool 4]

One thread, one take at a time through `Database.connection()` and `takes.take()`, as a request of
a lightly loaded web process makes them, on a random account among 100,000: each side takes
`--takes` in turn, `--reps` times. Reports per side the CPU per take of this thread
(time.thread_time: psycopg, the pool, the system calls) and of the Postgres server (its backends,
from /proc), and each side's ratio to the queue per repetition. Under full load every connection is
busy and the order does not matter; this is the cost of a take when some are idle.

Uses the database `--db` as `bench/run take` or `bench/run http` left it (100,000 accounts), or
creates it with --setup.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import server_urls, with_database  # noqa: E402
from psycopg_pool import ConnectionPool  # noqa: E402
from server_cpu import postmaster_pid, server_cpu  # noqa: E402
from take_bench import ACCOUNTS, PLANS_FILE, service_database  # noqa: E402

from service.config import Settings  # noqa: E402
from service.db import Connection, Database  # noqa: E402
from service.plans import PlanConfig, load_plans  # noqa: E402
from service.quota import takes  # noqa: E402


class QueueDatabase(Database):
    """The service's Database with psycopg_pool's own order (a queue)."""

    pool_class: type[ConnectionPool[Connection]] = ConnectionPool


def run(database: Database, plans: PlanConfig, n: int) -> None:
    for _ in range(n):
        with database.connection() as conn:
            takes.take(
                conn,
                plans,
                account_id=f"acct-{random.randint(1, ACCOUNTS)}",
                metric="urls",
                actor="bench-pool-order",
            )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", default="bench_ql", help="the service's scratch database (default bench_ql)")
    ap.add_argument("--setup", action="store_true", help="create --db afresh first (100,000 accounts)")
    ap.add_argument("--takes", type=int, default=500, help="takes per side per repetition")
    ap.add_argument("--reps", type=int, default=6)
    # 4: as the figure in bench/README.md was measured; one thread uses one connection at a time, and
    # the others only cool while idle (serve's default is 8)
    ap.add_argument("--pool", type=int, default=4, help="DB_POOL_SIZE of each side (default 4)")
    args = ap.parse_args(argv)
    pg, _ = server_urls(ap)
    url = service_database(pg, args.db) if args.setup else with_database(pg, args.db)
    settings = Settings(database_url=url, db_pool_size=args.pool, plans_file=PLANS_FILE)
    plans = load_plans(PLANS_FILE)
    sides = {
        "stack": Database(settings, min_size=args.pool),
        "queue": QueueDatabase(settings, min_size=args.pool),
    }
    pid = postmaster_pid(pg)
    own: dict[str, list[float]] = {name: [] for name in sides}
    db: dict[str, list[float]] = {name: [] for name in sides}
    try:
        for database in sides.values():
            database.pool.open(wait=True)
            run(database, plans, 200)  # every connection used, its statements prepared
        for rep in range(args.reps):
            order = list(sides) if rep % 2 == 0 else list(reversed(sides))
            for name in order:
                t0, s0 = time.thread_time(), server_cpu(pid)
                run(sides[name], plans, args.takes)
                own[name].append((time.thread_time() - t0) / args.takes * 1e6)
                db[name].append((server_cpu(pid) - s0) / args.takes * 1e6)
            print(
                f"rep {rep + 1}: "
                + ", ".join(f"{n} {own[n][-1]:.0f} us here + {db[n][-1]:.0f} us server" for n in sides),
                flush=True,
            )
    finally:
        for database in sides.values():
            database.close()
    print(f"\n{args.takes} takes per side per repetition, one thread, pool of {args.pool}, {args.reps} reps:")
    for name in sides:
        ratio_own = statistics.median(a / b for a, b in zip(own[name], own["queue"], strict=True))
        ratio_db = statistics.median(a / b for a, b in zip(db[name], db["queue"], strict=True))
        print(
            f"  {name}: {statistics.median(own[name]):.0f} us here (/ queue {ratio_own:.2f}), "
            f"{statistics.median(db[name]):.0f} us server (/ queue {ratio_db:.2f}) per take, medians"
        )
    print(f"  load average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
