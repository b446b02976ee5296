"""Batch take benchmark: `POST /v1/takes/batch` (ITEMS takes of random accounts per request) under
`quota-ledger serve` against pgbench's one-statement take (baseline/take_spread.sql), in the same
run, on the same Postgres, alternating which goes first.

    bench/run batch [--reps 5] [--items 100] [--seconds 10] [--wrk "-t2 -c8"]

The batch side's takes/s is counted from the ledger (rows written during the run / its length), so
a refused or failed item cannot inflate it. Prints every run, then the median ratio (target in
issue 24: >= 0.5), and the CPU per take of the web server and of Postgres.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import psycopg  # noqa: E402
from common import server, server_urls  # noqa: E402
from http_bench import backends, cpu_delta, cpu_seconds, process_tree, wait_ready  # noqa: E402
from take_bench import ACCOUNTS, BASELINE, PLANS_FILE, ROOT, product_key, run_pgbench, setup, with_database  # noqa: E402

LUA = HERE / "batch_take.lua"


def ledger_rows(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        return int(conn.execute("SELECT count(*) FROM ledger").fetchone()[0])  # type: ignore[index]


def run_batch(
    url: str, db_url: str, pid: int, wrk: list[str], seconds: int, items: int, key: str
) -> tuple[float, float, float]:
    """takes/s from the ledger, and the web server's and Postgres' CPU per take (microseconds)."""
    app, db = process_tree(pid), backends(db_url)
    a0, d0, n0 = cpu_seconds(app), cpu_seconds(db), ledger_rows(db_url)
    t0 = time.monotonic()
    cmd = ["wrk", *wrk, "-d", f"{seconds}s", "-s", str(LUA), url, "--", str(items), str(ACCOUNTS), key]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    elapsed = time.monotonic() - t0
    a1, d1, n1 = cpu_seconds(app), cpu_seconds(db), ledger_rows(db_url)
    if "Non-2xx" in out or "Socket errors" in out:
        print(out, file=sys.stderr)
    n = max(n1 - n0, 1)
    return n / min(elapsed, seconds + 0.5), cpu_delta(a0, a1) / n * 1e6, cpu_delta(d0, d1) / n * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--items", type=int, default=100)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--wrk", default="-t2 -c8", help="wrk threads and connections")
    ap.add_argument("--clients", type=int, default=8, help="pgbench clients")
    ap.add_argument("--port", type=int, default=8121)
    ap.add_argument("--no-setup", action="store_true", help="reuse bench_ql / bench_bl as they are")
    ap.add_argument("--log", default=str(HERE / "batch_bench.log"), help="server output goes here")
    args = ap.parse_args(argv)
    pg, redis_url = server_urls(ap)
    if args.no_setup:
        ql, bl = with_database(pg, "bench_ql"), with_database(pg, "bench_bl")
    else:
        print("setting up bench_ql and bench_bl ...", flush=True)
        ql, bl = setup(pg)
    key = product_key(ql)
    url = f"http://127.0.0.1:{args.port}"
    env = {**os.environ, "DATABASE_URL": ql, "REDIS_URL": redis_url, "PLANS_FILE": str(PLANS_FILE)}
    env["WEBHOOK_ENVIRONMENT"] = "any"
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    cmd = [sys.executable, "-m", "service.cli", "serve", "--bind", url[7:], "--workers", str(args.workers)]
    wrk = shlex.split(args.wrk)
    script = str(BASELINE / "take_spread.sql")
    rows = []
    with ExitStack() as stack:
        pid = stack.enter_context(server(cmd, cwd=ROOT, env=env, log=Path(args.log))).pid
        wait_ready(url, "/v1/accounts/acct-1/takes", key)
        run_batch(url, ql, pid, wrk, 3, args.items, key)  # warm: every worker connected
        for rep in range(args.reps):
            sides = ["pgbench", "batch"] if rep % 2 == 0 else ["batch", "pgbench"]
            got: dict[str, tuple[float, ...]] = {}
            for side in sides:
                if side == "batch":
                    got[side] = run_batch(url, ql, pid, wrk, args.seconds, args.items, key)
                else:
                    got[side] = run_pgbench(bl, script, clients=args.clients, seconds=args.seconds)
            (b, app_us, db_us), (p, _) = got["batch"], got["pgbench"]
            rows.append((b / p, b, p, app_us, db_us))
            print(
                f"rep {rep + 1}: batch of {args.items} {b:,.0f} takes/s (cpu/take web {app_us:.0f} us +"
                f" db {db_us:.0f} us); pgbench {p:,.0f} takes/s; ratio {b / p:.2f}",
                flush=True,
            )
    med = statistics.median
    print(
        f"\nbatch of {args.items} ({args.wrk}, {args.workers} workers) vs pgbench take_spread.sql "
        f"(-c {args.clients}), {args.reps} reps: ratio median {med(r[0] for r in rows):.2f} "
        f"(runs {', '.join(f'{r[0]:.2f}' for r in rows)}); batch {med(r[1] for r in rows):,.0f} takes/s, "
        f"pgbench {med(r[2] for r in rows):,.0f}; cpu/take web {med(r[3] for r in rows):.0f} us + "
        f"db {med(r[4] for r in rows):.0f} us"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
