"""Monthly reset benchmark: 1,000,000 counters, wall time, and take latency during the reset.

    bench/run reset [--counters 1000000] [--batch-size 2000]
                    [--take-procs 4] [--take-rate 1000] [--baseline-seconds 20]
                    [--reps 3] [--no-quiet-run]

Creates a scratch database `bench_reset` on the server named by DATABASE_URL with our migrations
and `--counters` counters (accounts x 3 metrics) in period P0 (this month), nine in ten holding
usage, so nine in ten get a reset ledger row (the expensive case). Then, per repetition (fresh
seed each time), on one server:

1. baseline: `--take-procs` processes issue `service.quota.takes.take()` against random counters at
   `--take-rate` takes/s in total, for `--baseline-seconds`, with no reset running (takes in P0);
2. reset under load: the same load, now taking in P1 (the new month), while the main process runs
   `service.quota.reset.reset_month()` for P1 with the clock at the 1st of P1, 00:05 UTC. Takes that
   reach a counter before the job do the lazy rollover, as they would on the 1st.

After the repetitions, unless --no-quiet-run, it seeds once more and runs the reset with no load.

Prints per repetition the reset wall time, take p50/p99/max in both phases and the p99 ratio
(during / baseline), then the medians. The machine is shared and noisy: quote the medians.
The load is paced (open loop per process), not flat out, so the baseline is not CPU-saturated on a
2-core machine; latency is measured per take call. The seeded usage has no take rows in the ledger
(it is a counter-only seed; counter = ledger does not hold for it and is not checked here).
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import random
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
from common import server_urls, with_database  # noqa: E402

from service.billing.plans import load_plans  # noqa: E402
from service.migrate import migrate  # noqa: E402
from service.quota import periods  # noqa: E402
from service.quota.reset import DEFAULT_BATCH_SIZE, reset_month  # noqa: E402
from service.quota.takes import take  # noqa: E402

DB = "bench_reset"
PLANS_FILE = ROOT / "plans.toml"  # metrics: api_calls, seats, urls
METRICS = ("api_calls", "seats", "urls")


def account_id(i: int) -> str:
    return f"b{i:07d}"


def seed(pg: str, counters: int, period: str) -> tuple[str, int]:
    """A fresh migrated database with ceil(counters / 3) accounts x 3 metrics in `period`."""
    with psycopg.connect(pg, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{DB}"')
    url = with_database(pg, DB)
    migrate(url)
    accounts = -(-counters // len(METRICS))
    t0 = time.monotonic()
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(
            "INSERT INTO accounts (id, kind, plan) "
            "SELECT 'b' || lpad(i::text, 7, '0'), 'user', 'free' FROM generate_series(1, %s) i",
            (accounts,),
        )
        # unlimited counters, so that no take is refused; nine in ten hold some usage
        c.execute(
            "INSERT INTO quotas (account_id, metric, plan_limit, free_limit, period, used) "
            "SELECT a.id, m.metric, NULL, NULL, %s, "
            "       CASE WHEN random() < 0.9 THEN 1 + (random() * 20)::int ELSE 0 END "
            "  FROM accounts a CROSS JOIN unnest(%s::text[]) AS m (metric)",
            (period, list(METRICS)),
        )
        c.execute("VACUUM ANALYZE")
        c.execute("CHECKPOINT")
    print(f"seeded {accounts * len(METRICS):,} counters in {time.monotonic() - t0:.1f} s", flush=True)
    return url, accounts


def load(url: str, accounts: int, period: str, rate: float, stop: Any, out: Any, seed_no: int) -> None:
    """One take process: paced takes against random counters until `stop`; sends back
    [(start time, latency)]."""
    plans = load_plans(PLANS_FILE)
    rnd = random.Random(seed_no)
    samples: list[tuple[float, float]] = []
    with psycopg.connect(url, autocommit=True) as conn:
        interval = 1.0 / rate
        next_at = time.perf_counter()
        while not stop.is_set():
            now = time.perf_counter()
            if now < next_at:
                time.sleep(next_at - now)
            next_at += interval
            acct = account_id(rnd.randint(1, accounts))
            t = time.perf_counter()
            take(
                conn,
                plans,
                account_id=acct,
                metric=rnd.choice(METRICS),
                units=1,
                actor="bench",
                period=period,
            )
            samples.append((t, time.perf_counter() - t))
    out.put(samples)


def run_load(
    url: str, accounts: int, period: str, args: argparse.Namespace, during: Any
) -> list[tuple[float, float]]:
    """Start the take processes, call `during()` (returns when the phase is over), stop, collect."""
    ctx = mp.get_context("spawn")
    stop, out = ctx.Event(), ctx.Queue()
    rate = args.take_rate / args.take_procs
    procs = [
        ctx.Process(target=load, args=(url, accounts, period, rate, stop, out, i))
        for i in range(args.take_procs)
    ]
    for p in procs:
        p.start()
    time.sleep(2.0)  # connections open, imports done
    window = during()
    stop.set()
    samples = [s for _ in procs for s in out.get()]
    for p in procs:
        p.join()
    lo, hi = window
    return [s for s in samples if lo <= s[0] <= hi]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000


def describe(name: str, samples: list[tuple[float, float]]) -> dict[str, float]:
    lat = [s[1] for s in samples]
    d = {"n": len(lat), "p50": pct(lat, 0.50), "p99": pct(lat, 0.99), "max": max(lat) * 1000}
    print(
        f"  {name:<22} takes {d['n']:>7,}  p50 {d['p50']:6.2f} ms  p99 {d['p99']:6.2f} ms"
        f"  max {d['max']:7.1f} ms"
    )
    return d


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--counters", type=int, default=1_000_000)
    ap.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE)
    ap.add_argument("--pause", type=float, default=0.0, help="seconds between reset batches")
    ap.add_argument("--take-procs", type=int, default=4)
    ap.add_argument("--take-rate", type=float, default=1000.0, help="takes per second, all processes")
    ap.add_argument("--baseline-seconds", type=float, default=20.0)
    ap.add_argument("--reps", type=int, default=3, help="seed + baseline + reset, repeated")
    ap.add_argument("--no-quiet-run", action="store_true", help="skip the reset without load")
    ap.add_argument("--keep", action="store_true", help=f"keep the scratch database {DB}")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    pg, _ = server_urls(ap)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)

    p0 = periods.current_period()
    p1 = periods.next_period(p0)
    at = periods.period_start(p1) + timedelta(minutes=5)
    print(
        f"reset benchmark: {args.counters:,} counters, P0 {p0} -> P1 {p1}, batch {args.batch_size}, "
        f"load {args.take_rate:.0f} takes/s from {args.take_procs} processes, {args.reps} reps",
        flush=True,
    )
    walls, ratios, base_p99, during_p99 = [], [], [], []
    for rep in range(1, args.reps + 1):
        print(f"\nrep {rep}/{args.reps}")
        url, accounts = seed(pg, args.counters, p0)

        def baseline() -> tuple[float, float]:
            lo = time.perf_counter()
            time.sleep(args.baseline_seconds)
            return lo, time.perf_counter()

        base = run_load(url, accounts, p0, args, baseline)
        outcome: list[Any] = []

        def resetting(url: str = url, outcome: list[Any] = outcome) -> tuple[float, float]:
            with psycopg.connect(url, autocommit=True) as conn:
                lo = time.perf_counter()
                outcome.append(reset_month(conn, at=at, batch_size=args.batch_size, pause=args.pause))
                return lo, time.perf_counter()

        with psycopg.connect(url, autocommit=True) as c:
            c.execute("CHECKPOINT")
        during = run_load(url, accounts, p1, args, resetting)
        loaded = outcome[0]
        print(f"  {loaded.message}")
        b = describe("baseline (no reset)", base)
        d = describe("during the reset", during)
        walls.append(loaded.duration_s)
        ratios.append(d["p99"] / b["p99"])
        base_p99.append(b["p99"])
        during_p99.append(d["p99"])
        print(f"  p99 ratio {ratios[-1]:.2f}x, reset wall time under load {loaded.duration_s:.1f} s")

    med = statistics.median
    print(
        f"\nmedians over {args.reps} reps: reset wall time under load {med(walls):.1f} s (target <= 60 s); "
        f"take p99 {med(base_p99):.2f} ms -> {med(during_p99):.2f} ms, "
        f"ratio {med(ratios):.2f}x (target <= 3x)"
    )
    if not args.no_quiet_run:
        url, _ = seed(pg, args.counters, p0)
        with psycopg.connect(url, autocommit=True) as conn:
            quiet = reset_month(conn, at=at, batch_size=args.batch_size, pause=args.pause)
        print(f"reset without load: {quiet.message}")
    if not args.keep:
        with psycopg.connect(pg, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
    ok = med(ratios) <= 3 and med(walls) <= 60
    print("result:", "within targets" if ok else "OUTSIDE targets")
    return 0


if __name__ == "__main__":
    sys.exit(main())
