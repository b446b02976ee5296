"""Monthly reset benchmark: 1,000,000 counters, wall time, and take latency during the reset.

    bench/run reset [--counters 1000000] [--batch-size 250] [--duty 0.05] [--min-rate 1500]
                    [--take-procs 4] [--take-rate 1000] [--baseline-seconds 20] [--reps 3]
                    [--quiet-run]

Creates a scratch database `bench_reset` on the server named by DATABASE_URL with our migrations
and `--counters` counters (accounts x 3 metrics) in period P0 (this month), nine in ten holding
usage, so nine in ten get a reset ledger row (the expensive case). Then, per repetition (fresh
seed each time), on one server, with `--take-procs` processes issuing `service.quota.takes.take()`
against random counters at `--take-rate` takes/s in total (paced, open loop per process; latency
measured per call):

1. old month: takes in P0 for `--baseline-seconds`, no reset (plain one-statement takes);
2. new month, no job: takes in P1 for `--baseline-seconds` with no reset running, so nearly every
   take opens its counter's month by the lazy rollover (four statements, two commits) -- what
   takes cost on the 1st without the job;
3. new month, with the job: the same load in P1 while the main process runs
   `service.quota.reset.reset_month()` for P1 (clock at the 1st of P1, 00:05 UTC), paced.

The job's own effect on takes is phase 3 against phase 2 (the target: p99 within 1.5x, 1,000,000
counters within 15 minutes); phase 3 against phase 1 is also printed (it adds the rollover's cost,
which the job shortens rather than causes). Each phase also reports how quiet the machine was:
the load average at its start and the share of CPU time idle during it (/proc/stat, Linux),
so that a run on a busy shared machine can be recognised as such. --quiet-run adds a reset
with no load after the repetitions. The seeded usage has no take rows in the ledger (a counter-only
seed; counter = ledger does not hold for it and is not checked here).
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import os
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

from service.migrate import migrate  # noqa: E402
from service.plans import load_plans  # noqa: E402
from service.quota import periods  # noqa: E402
from service.quota.reset import (  # noqa: E402
    DEFAULT_BATCH_SIZE,
    DEFAULT_DUTY,
    DEFAULT_MIN_RATE,
    reset_month,
)
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


class Quiet:
    """How busy the machine was over an interval: load average at its start, CPU idle share."""

    def __init__(self) -> None:
        self.load = os.getloadavg()[0]
        self.cpu = self._cpu()

    @staticmethod
    def _cpu() -> tuple[int, int] | None:
        try:
            fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        except (OSError, ValueError):
            return None
        return fields[3] + fields[4], sum(fields)  # idle + iowait, total

    def done(self) -> str:
        end = self._cpu()
        idle = ""
        if self.cpu and end and end[1] > self.cpu[1]:
            idle = f", CPU idle {100 * (end[0] - self.cpu[0]) / (end[1] - self.cpu[1]):.0f}%"
        return f"load average {self.load:.1f} at start{idle}"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000


def describe(name: str, samples: list[tuple[float, float]], quiet: str) -> dict[str, float]:
    lat = [s[1] for s in samples]
    d = {"n": len(lat), "p50": pct(lat, 0.50), "p99": pct(lat, 0.99), "max": max(lat) * 1000}
    print(
        f"  {name:<26} takes {d['n']:>7,}  p50 {d['p50']:6.2f} ms  p99 {d['p99']:6.2f} ms"
        f"  max {d['max']:7.1f} ms  ({quiet})"
    )
    return d


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--counters", type=int, default=1_000_000)
    ap.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE)
    ap.add_argument("--duty", type=float, default=DEFAULT_DUTY, help="pacing: share of time in batches")
    ap.add_argument("--min-rate", type=float, default=DEFAULT_MIN_RATE, help="pacing: counters/s at least")
    ap.add_argument("--pause", type=float, default=0.0, help="extra seconds between reset batches")
    ap.add_argument("--take-procs", type=int, default=4)
    ap.add_argument("--take-rate", type=float, default=1000.0, help="takes per second, all processes")
    ap.add_argument("--baseline-seconds", type=float, default=20.0)
    ap.add_argument("--reps", type=int, default=3, help="seed + the three phases, repeated")
    ap.add_argument("--quiet-run", action="store_true", help="also a reset with no load")
    ap.add_argument("--keep", action="store_true", help=f"keep the scratch database {DB}")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    pg, _ = server_urls(ap)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)

    p0 = periods.current_period()
    p1 = periods.next_period(p0)
    at = periods.period_start(p1) + timedelta(minutes=5)
    pacing = {
        "batch_size": args.batch_size,
        "pause": args.pause,
        "duty": args.duty,
        "min_rate": args.min_rate,
    }
    print(
        f"reset benchmark: {args.counters:,} counters, P0 {p0} -> P1 {p1}, batch {args.batch_size}, "
        f"duty {args.duty}, min rate {args.min_rate:.0f}/s; load {args.take_rate:.0f} takes/s from "
        f"{args.take_procs} processes, {args.reps} reps; {os.cpu_count()} CPUs",
        flush=True,
    )
    walls: list[float] = []
    ratios_new: list[float] = []
    ratios_old: list[float] = []
    p99 = {"old": [], "new": [], "during": []}  # type: dict[str, list[float]]
    for rep in range(1, args.reps + 1):
        print(f"\nrep {rep}/{args.reps}")
        url, accounts = seed(pg, args.counters, p0)

        def sleeping() -> tuple[float, float]:
            lo = time.perf_counter()
            time.sleep(args.baseline_seconds)
            return lo, time.perf_counter()

        q_old = Quiet()
        old = run_load(url, accounts, p0, args, sleeping)
        q_old_s = q_old.done()
        q_new = Quiet()
        new = run_load(url, accounts, p1, args, sleeping)
        q_new_s = q_new.done()
        outcome: list[Any] = []

        def resetting(url: str = url, outcome: list[Any] = outcome) -> tuple[float, float]:
            with psycopg.connect(url, autocommit=True) as conn:
                lo = time.perf_counter()
                outcome.append(reset_month(conn, at=at, **pacing))
                return lo, time.perf_counter()

        with psycopg.connect(url, autocommit=True) as c:
            c.execute("CHECKPOINT")
        q_during = Quiet()
        during = run_load(url, accounts, p1, args, resetting)
        q_during_s = q_during.done()
        loaded = outcome[0]
        print(f"  {loaded.message}")
        a = describe("old month, no job", old, q_old_s)
        b = describe("new month, no job", new, q_new_s)
        d = describe("new month, during the job", during, q_during_s)
        walls.append(loaded.duration_s)
        ratios_new.append(d["p99"] / b["p99"])
        ratios_old.append(d["p99"] / a["p99"])
        for k, v in (("old", a), ("new", b), ("during", d)):
            p99[k].append(v["p99"])
        print(
            f"  p99 during the job / new month without it: {ratios_new[-1]:.2f}x; "
            f"/ old month: {ratios_old[-1]:.2f}x; reset wall time under load {loaded.duration_s:.1f} s"
        )

    med = statistics.median
    print(
        f"\nmedians over {args.reps} reps: reset of {args.counters:,} counters under load "
        f"{med(walls):.1f} s (target <= 900 s for 1,000,000); take p99 new month without the job "
        f"{med(p99['new']):.2f} ms -> during it {med(p99['during']):.2f} ms, ratio {med(ratios_new):.2f}x "
        f"(target <= 1.5x); old month {med(p99['old']):.2f} ms, ratio {med(ratios_old):.2f}x"
    )
    if args.quiet_run:
        url, _ = seed(pg, args.counters, p0)
        with psycopg.connect(url, autocommit=True) as conn:
            alone = reset_month(conn, at=at, **pacing)
        print(f"reset without load: {alone.message}")
    if not args.keep:
        with psycopg.connect(pg, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
    # the 15-minute bound is for 1,000,000 counters; scale it for a smaller smoke run
    ok = med(ratios_new) <= 1.5 and med(walls) <= 900 * args.counters / 1_000_000
    print("result:", "within targets" if ok else "OUTSIDE targets")
    return 0


if __name__ == "__main__":
    sys.exit(main())
