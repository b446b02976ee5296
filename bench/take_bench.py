"""In-process take() benchmark against the pgbench baseline, in the same run, on the same Postgres.

    bench/run take [--reps 5] [--seconds 10]            (or: python bench/take_bench.py ...)

Sets up two scratch databases on the server named by DATABASE_URL: `bench_ql` (our
migrations, 100,000 accounts, bench/plans.toml) and `bench_bl` (baseline/schema.sql). Then, for each
repetition, alternating which goes first: `pgbench -n -c 8 -j 2 -T S -f baseline/take_spread.sql` on
bench_bl and `service.quota.takes.take()` from 8 threads (one connection each) on bench_ql. The same
again with every take on one account (take_hot.sql). Prints every run, then medians and the median of
the per-repetition ratios (ours / baseline). Absolute figures move with the machine's load; the
ratio is the result.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BASELINE = HERE / "baseline"
PLANS_FILE = HERE / "plans.toml"
ACCOUNTS = 100_000
METRIC = "urls"
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
from common import recreate_database, server_urls, with_database  # noqa: E402

from service.keys import create_key  # noqa: E402
from service.migrate import migrate  # noqa: E402
from service.plans import load_plans  # noqa: E402
from service.quota import periods  # noqa: E402
from service.quota.takes import take  # noqa: E402


def account_name(i: int) -> str:
    return f"acct-{i}"


def setup(pg: str, *, ql: str = "bench_ql", bl: str = "bench_bl") -> tuple[str, str]:
    """Fresh scratch databases, seeded with 100,000 accounts each. Returns (ours, baseline) URLs."""
    return service_database(pg, ql), baseline_database(pg, bl)


def service_database(pg: str, name: str) -> str:
    """A fresh scratch database `name` with our migrations and 100,000 accounts; returns its URL."""
    return seed_service_database(recreate_database(pg, name))


def baseline_database(pg: str, name: str = "bench_bl") -> str:
    """A fresh scratch database `name` with the baseline's schema (baseline/schema.sql)."""
    bl_url = recreate_database(pg, name)
    subprocess.run(
        ["psql", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(BASELINE / "schema.sql"), bl_url],
        check=True,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "PGOPTIONS": "-c client_min_messages=warning"},
    )
    with psycopg.connect(bl_url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE bl_usage")
    return bl_url


def seed_service_database(ql_url: str) -> str:
    """Our migrations and 100,000 accounts in the empty database at `ql_url`; returns it."""
    migrate(ql_url)
    plans = load_plans(PLANS_FILE)
    plan = plans.free_plan
    metrics = list(plans.metrics)
    with psycopg.connect(ql_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO accounts (id, kind, plan) SELECT 'acct-' || g, 'user', %s"
            " FROM generate_series(1, %s) g",
            (plan, ACCOUNTS),
        )
        # One counter row per (account, metric), in the current period: no take needs a rollover.
        conn.execute(
            "INSERT INTO quotas (account_id, metric, plan_limit, free_limit, period)"
            " SELECT 'acct-' || g, m.metric, m.lim, m.lim, %s"
            "   FROM generate_series(1, %s) g, unnest(%s::text[], %s::bigint[]) AS m (metric, lim)",
            (periods.current_period(), ACCOUNTS, metrics, [plans.limit(plan, m) for m in metrics]),
        )
        conn.execute("VACUUM ANALYZE accounts")
        conn.execute("VACUUM ANALYZE quotas")
    return ql_url


def product_key(ql_url: str, name: str = "bench") -> str:
    with psycopg.connect(ql_url, autocommit=True) as conn:
        conn.execute("UPDATE api_keys SET revoked_at = now() WHERE name = %s AND revoked_at IS NULL", (name,))
        return create_key(conn, name=name, role="product")


# --- the in-process side ------------------------------------------------------------------------


def use_take_statement(sql: str) -> None:
    """Make take() run `sql` instead of service/quota/takes.sql's `take` in this process
    (bench/chain_bench.py's chain-off side; never done by the service)."""
    from service.db import Q

    Q._q["take"] = sql


def _take_worker(
    url: str, threads: int, seconds: float, start_at: float, hot: bool, out: mp.Queue, take_sql: str | None
) -> None:
    """`threads` threads, one connection each, taking until start_at + seconds; puts the count."""
    if take_sql is not None:
        use_take_statement(take_sql)
    plans = load_plans(PLANS_FILE)
    counts = [0] * threads
    errors: list[BaseException] = []
    ready = threading.Barrier(threads)

    def run(i: int) -> None:
        rnd = random.Random(os.getpid() * 1000 + i)
        try:
            with psycopg.connect(url, autocommit=True, application_name="bench-take") as conn:
                ready.wait()
                time.sleep(max(start_at - time.time(), 0))
                end = start_at + seconds
                n = 0
                while time.time() < end:
                    aid = 1 if hot else rnd.randint(1, ACCOUNTS)
                    take(conn, plans, account_id=account_name(aid), metric=METRIC, actor="bench")
                    n += 1
                counts[i] = n
        except BaseException as e:  # surface it in the parent instead of a silent low count
            errors.append(e)

    ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    time.sleep(max(start_at - time.time(), 0))
    cpu0 = time.process_time()  # this process's CPU (all threads) over the timed window only
    for t in ts:
        t.join()
    out.put(repr(errors[0]) if errors else (sum(counts), time.process_time() - cpu0))


def run_takes(
    url: str, *, threads: int, procs: int, seconds: float, hot: bool, take_sql: str | None = None
) -> tuple[float, float]:
    """Takes per second from `threads` threads spread over `procs` processes, and the client CPU
    seconds per take. `take_sql`: the statement take() runs instead of its own."""
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    start_at = time.time() + 1.5 + 0.5 * procs  # everyone connected before the clock starts
    per = [threads // procs + (1 if i < threads % procs else 0) for i in range(procs)]
    ps = [ctx.Process(target=_take_worker, args=(url, n, seconds, start_at, hot, out, take_sql)) for n in per]
    for p in ps:
        p.start()
    results = [out.get() for _ in ps]
    for p in ps:
        p.join()
    bad = [r for r in results if isinstance(r, str)]
    if bad:
        raise RuntimeError(f"take worker failed: {bad[0]}")
    n = sum(r[0] for r in results)
    return n / seconds, sum(r[1] for r in results) / max(n, 1)


def our_take_script(tmp: Path, *, hot: bool, sql: str | None = None, stem: str = "take_ours") -> Path:
    """Our `take` statement (service/quota/takes.sql) as a pgbench script: the database-side cost of
    our schema (text ids, generated limit columns, a wider ledger row with three indexes) with no
    Python in the loop, for comparison with the baseline's statement."""
    from service.db import Q

    aid = "1" if hot else ":aid"
    sql = sql or Q.take
    for name, value in {
        "account_id": f"('acct-' || {aid})",
        "metric": f"'{METRIC}'",
        "units": "1",
        "period": f"'{periods.current_period()}'",
        "idempotency_key": "NULL::text",
        "actor": "'bench'",
    }.items():
        sql = sql.replace(f"%({name})s", value)
    body = "\n".join(line for line in sql.splitlines() if not line.lstrip().startswith("--"))
    path = tmp / (f"{stem}_hot.sql" if hot else f"{stem}_spread.sql")
    path.write_text(("" if hot else f"\\set aid random(1, {ACCOUNTS})\n") + body + ";\n")
    return path


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_pgbench(
    url: str, script: str, *, clients: int, seconds: float, mode: str = "simple"
) -> tuple[float, float]:
    """pgbench's tps, and its CPU seconds per transaction."""
    cmd = ["pgbench", "-n", "-M", mode, "-c", str(clients), "-j", "2", "-T", str(int(seconds)), "-f", script]
    cmd.append(url)
    cpu0 = children_cpu()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    cpu = children_cpu() - cpu0
    m = re.search(r"tps = ([0-9.]+)", out)
    t = re.search(r"number of transactions actually processed: (\d+)", out)
    if not m or not t:
        raise RuntimeError(f"no tps in pgbench output:\n{out}")
    return float(m.group(1)), cpu / max(int(t.group(1)), 1)


def compare(label: str, pairs: list[tuple[float, float]]) -> str:
    ratios = [o / b for b, o in pairs]
    bl = [b for b, _ in pairs]
    oo = [o for _, o in pairs]
    return (
        f"{label}: ratio median {statistics.median(ratios):.2f} "
        f"(runs {', '.join(f'{r:.2f}' for r in ratios)}); "
        f"ours median {statistics.median(oo):,.0f}/s, baseline median {statistics.median(bl):,.0f}/s"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument(
        "--procs",
        type=int,
        nargs="+",
        default=[1, 2],
        help="process counts to run the threads in (0: only the pgbench statement comparison)",
    )
    ap.add_argument("--no-hot", action="store_true", help="skip the hot-row variant")
    ap.add_argument(
        "--no-sql", action="store_true", help="skip pgbench running our take statement (database-side cost)"
    )
    ap.add_argument("--no-setup", action="store_true", help="reuse bench_ql / bench_bl as they are")
    args = ap.parse_args(argv)
    pg, _ = server_urls(ap)
    if args.no_setup:
        ql, bl = with_database(pg, "bench_ql"), with_database(pg, "bench_bl")
    else:
        print("setting up bench_ql and bench_bl ...", flush=True)
        ql, bl = setup(pg)
    variants = [("spread", False, "take_spread.sql")]
    if not args.no_hot:
        variants.append(("hot", True, "take_hot.sql"))
    summary = []
    tmp = Path(tempfile.mkdtemp(prefix="bench-take-"))
    for name, hot, script in variants:
        if not args.no_sql:
            ours_sql = str(our_take_script(tmp, hot=hot))
            sql_pairs: list[tuple[float, float]] = []
            for rep in range(args.reps):
                order = [(bl, str(BASELINE / script)), (ql, ours_sql)]
                # Prepared, as psycopg runs our statement after its fifth execution: this compares
                # execution cost, not how long each statement's text takes to parse and plan.
                got_sql = [
                    run_pgbench(db, f, clients=args.threads, seconds=args.seconds, mode="prepared")[0]
                    for db, f in (order if rep % 2 == 0 else order[::-1])
                ]
                b, o = got_sql if rep % 2 == 0 else got_sql[::-1]
                sql_pairs.append((b, o))
                print(
                    f"{name} pgbench -M prepared, our statement vs the baseline's, rep {rep + 1}: "
                    f"{o:,.0f} vs {b:,.0f} tps, ratio {o / b:.2f}",
                    flush=True,
                )
            label = f"{name}, our take statement vs the baseline's, pgbench -M prepared"
            summary.append(compare(label, sql_pairs))
        for procs in [p for p in args.procs if p > 0]:
            pairs: list[tuple[float, float]] = []
            cpu: list[tuple[float, float]] = []
            for rep in range(args.reps):
                sides = ["baseline", "ours"] if rep % 2 == 0 else ["ours", "baseline"]
                got: dict[str, tuple[float, float]] = {}
                for side in sides:
                    if side == "baseline":
                        got[side] = run_pgbench(
                            bl, str(BASELINE / script), clients=args.threads, seconds=args.seconds
                        )
                    else:
                        got[side] = run_takes(
                            ql, threads=args.threads, procs=procs, seconds=args.seconds, hot=hot
                        )
                (b, b_cpu), (o, o_cpu) = got["baseline"], got["ours"]
                pairs.append((b, o))
                cpu.append((b_cpu, o_cpu))
                print(
                    f"{name} {args.threads} threads / {procs} proc rep {rep + 1}: "
                    f"pgbench {b:,.0f} tps, take() {o:,.0f}/s, ratio {o / b:.2f}; "
                    f"client CPU per take: pgbench {b_cpu * 1e6:.0f} us, take() {o_cpu * 1e6:.0f} us",
                    flush=True,
                )
            summary.append(
                compare(f"{name}, {args.threads} threads in {procs} process(es)", pairs)
                + f"; client CPU per take median: take() {statistics.median(c for _, c in cpu) * 1e6:.0f} us,"
                f" pgbench {statistics.median(c for c, _ in cpu) * 1e6:.0f} us"
            )
    print("\n" + "\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
