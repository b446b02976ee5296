"""The cost of the ledger's hash chain on the take: chain on vs chain off, in the same run, on the same
Postgres (target: on / off >= 0.9, in-process and over HTTP).

    bench/run chain [--reps 5] [--seconds 10] [--wrk "-t2 -c32 -d10s"]   (or: python bench/chain_bench.py)

Chain on is the service as it is (service/quota/takes.sql `take`, on `bench_chain_on`). Chain off is the take
statement from before the chain (bench/take_unchained.sql: no id drawn in the UPDATE, no hash, no
head), run by the very same take() and the very same `quota-ledger serve` on `bench_chain_off`, a
copy of the same schema whose `ledger.hash` accepts NULL. Both databases are seeded alike (100,000
accounts, as bench/take_bench.py does), so the two sides differ only by the statement.

Phases, each alternating which side goes first per repetition:
  sql   both statements under `pgbench -M prepared -c 8 -j 2` (the database side alone)
  take  take() from 8 threads in one process, a random account among 100,000
  http  `serve --workers 4` for each side, wrk with bench/http_take.lua on both (random account)
Prints every run, then per phase the median of the per-repetition ratios (on / off).
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import psycopg  # noqa: E402
from common import server, server_urls, with_database  # noqa: E402
from http_bench import WrkResult, measured, run_wrk, wait_ready  # noqa: E402
from take_bench import (  # noqa: E402
    ACCOUNTS,
    PLANS_FILE,
    ROOT,
    our_take_script,
    product_key,
    run_pgbench,
    run_takes,
    service_database,
)

UNCHAINED = HERE / "take_unchained.sql"
ON, OFF = "bench_chain_on", "bench_chain_off"


def setup(pg: str) -> tuple[str, str]:
    on = service_database(pg, ON)
    off = service_database(pg, OFF)
    with psycopg.connect(off, autocommit=True) as conn:
        conn.execute("ALTER TABLE ledger ALTER COLUMN hash DROP NOT NULL")
    return on, off


def unchained_sql() -> str:
    return "\n".join(line for line in UNCHAINED.read_text().splitlines() if not line.startswith("--")).strip()


def ratio_line(label: str, pairs: list[tuple[float, float]]) -> str:
    ratios = [on / off for on, off in pairs]
    runs = ", ".join(f"{r:.2f}" for r in ratios)
    return (
        f"{label}: on/off median {statistics.median(ratios):.2f} (runs {runs}); "
        f"on median {statistics.median(p[0] for p in pairs):,.0f}/s, "
        f"off median {statistics.median(p[1] for p in pairs):,.0f}/s"
    )


def alternate(rep: int, run: Callable[[str], float]) -> tuple[float, float]:
    """run("on") and run("off"), off first on even repetitions; returns (on, off)."""
    got = {side: run(side) for side in (["off", "on"] if rep % 2 == 0 else ["on", "off"])}
    return got["on"], got["off"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=10, help="per pgbench and take() run")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--workers", type=int, default=4, help="worker processes per server")
    ap.add_argument("--wrk", default="-t2 -c32 -d10s", help="wrk settings, the same for both servers")
    ap.add_argument("--port", type=int, default=8111, help="chain on at PORT, off at PORT+1")
    ap.add_argument("--phases", nargs="+", default=["sql", "take", "http"], choices=["sql", "take", "http"])
    ap.add_argument("--no-setup", action="store_true", help=f"reuse {ON} / {OFF} as they are")
    ap.add_argument("--log", default=str(HERE / "chain_bench.log"), help="server output goes here")
    args = ap.parse_args(argv)
    pg, redis_url = server_urls(ap)
    if args.no_setup:
        on, off = with_database(pg, ON), with_database(pg, OFF)
    else:
        print(f"setting up {ON} and {OFF} ...", flush=True)
        on, off = setup(pg)
    off_sql = unchained_sql()
    summary = []

    if "sql" in args.phases:
        tmp = Path(tempfile.mkdtemp(prefix="bench-chain-"))
        scripts = {
            "on": (on, str(our_take_script(tmp, hot=False))),
            "off": (off, str(our_take_script(tmp, hot=False, sql=off_sql, stem="take_unchained"))),
        }

        def sql_run(side: str) -> float:
            db, script = scripts[side]
            return run_pgbench(db, script, clients=args.threads, seconds=args.seconds, mode="prepared")[0]

        pairs = []
        for rep in range(args.reps):
            pair = alternate(rep, sql_run)
            pairs.append(pair)
            print(
                f"sql rep {rep + 1}: on {pair[0]:,.0f} tps, off {pair[1]:,.0f} tps, {pair[0] / pair[1]:.2f}"
            )
        summary.append(ratio_line("statement, pgbench -M prepared", pairs))

    if "take" in args.phases:

        def take_run(side: str) -> float:
            db, sql = (on, None) if side == "on" else (off, off_sql)
            return run_takes(
                db, threads=args.threads, procs=1, seconds=args.seconds, hot=False, take_sql=sql
            )[0]

        pairs = []
        for rep in range(args.reps):
            pair = alternate(rep, take_run)
            pairs.append(pair)
            print(f"take() rep {rep + 1}: on {pair[0]:,.0f}/s, off {pair[1]:,.0f}/s, {pair[0] / pair[1]:.2f}")
        summary.append(ratio_line(f"take(), {args.threads} threads in 1 process", pairs))

    if "http" in args.phases:
        wrk_args = shlex.split(args.wrk)
        log = Path(args.log)
        py = sys.executable
        urls = {"on": f"http://127.0.0.1:{args.port}", "off": f"http://127.0.0.1:{args.port + 1}"}
        dbs = {"on": on, "off": off}
        keys = {side: product_key(db) for side, db in dbs.items()}
        req = ("/v1/accounts/{id}/takes", ACCOUNTS)
        with ExitStack() as stack:
            pids = {}
            for side in ("on", "off"):
                env = {**os.environ, "DATABASE_URL": dbs[side], "REDIS_URL": redis_url}
                env["PLANS_FILE"] = str(PLANS_FILE)
                # serve refuses to start without one; no webhook is sent here
                env["WEBHOOK_ENVIRONMENT"] = "any"
                env.pop("PROMETHEUS_MULTIPROC_DIR", None)
                cmd = [py, str(HERE / "serve_variant.py")]
                cmd += ["--take-sql", str(UNCHAINED)] if side == "off" else []
                cmd += ["serve", "--bind", urls[side][7:], "--workers", str(args.workers)]
                pids[side] = stack.enter_context(server(cmd, cwd=ROOT, env=env, log=log)).pid
            for side in ("on", "off"):
                wait_ready(urls[side], "/v1/accounts/acct-1/takes", keys[side])
                warm = [a for a in wrk_args if not a.startswith("-d")] + ["-d3s"]
                run_wrk(urls[side], warm, *req, keys[side])  # type: ignore[arg-type]
            results: dict[str, WrkResult] = {}

            def http_run(side: str) -> float:
                results[side] = measured(urls[side], dbs[side], pids[side], wrk_args, *req, keys[side])
                return results[side].rps

            pairs = []
            for rep in range(args.reps):
                pair = alternate(rep, http_run)
                pairs.append(pair)
                bad = sum(r.non_2xx for r in results.values())
                print(
                    f"http rep {rep + 1}: on {results['on']}; off {results['off']}; {pair[0] / pair[1]:.2f}"
                    + (f"; NON-2xx {bad}" if bad else ""),
                    flush=True,
                )
        summary.append(ratio_line(f"HTTP take ({args.wrk}, {args.workers} workers)", pairs))

    print("\n" + "\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
