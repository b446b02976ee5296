"""The check's cost against the take's: `GET /v1/accounts/{id}/check?metric=urls` and `POST
/v1/accounts/{id}/takes` under the same `quota-ledger serve --workers 4`, on the same database
(100,000 accounts, a random one per request), with the same wrk settings, alternating which goes
first in each repetition. Measures CPU per request from /proc, three ways: the database's (the
service's Postgres backends, as `bench/run http` reads them: the target, the check at most 0.5 of the
take, since the check is one indexed read where the take writes a counter and a ledger row); the
whole PostgreSQL server's (bench/server_cpu.py: the postmaster and every child, background writers
included, but also any other database's backends on a shared server); and the web processes' plus
the backends' (everything the service spends).

    bench/run check [--reps 5] [--wrk "-t2 -c32 -d10s"] [--no-setup]
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
from contextlib import ExitStack
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import server, server_urls, with_database, wrk_seconds  # noqa: E402
from http_bench import WrkResult, measured, medians, run_wrk, wait_ready  # noqa: E402
from server_cpu import postmaster_pid, server_cpu  # noqa: E402
from take_bench import ACCOUNTS, PLANS_FILE, ROOT, product_key, service_database  # noqa: E402

TAKE = ("/v1/accounts/{id}/takes", ACCOUNTS)
CHECK = ("/v1/accounts/{id}/check?metric=urls", ACCOUNTS)


def cpu(r: WrkResult) -> float:
    return r.app_us + r.db_us


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--wrk", default="-t2 -c32 -d10s", help="wrk settings, the same for both routes")
    ap.add_argument("--port", type=int, default=8103)
    ap.add_argument("--no-setup", action="store_true", help="reuse bench_ql as it is")
    ap.add_argument("--log", default=str(HERE / "check_bench.log"), help="server output goes here")
    args = ap.parse_args(argv)
    pg, redis_url = server_urls(ap)
    if args.no_setup:
        ql = with_database(pg, "bench_ql")
    else:
        print("setting up bench_ql ...", flush=True)
        ql = service_database(pg, "bench_ql")
    key = product_key(ql)
    wrk_args = shlex.split(args.wrk)
    url = f"http://127.0.0.1:{args.port}"
    env = {**os.environ, "DATABASE_URL": ql, "REDIS_URL": redis_url, "PLANS_FILE": str(PLANS_FILE)}
    env["WEBHOOK_ENVIRONMENT"] = "any"
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    cmd = [sys.executable, "-m", "service.cli", "serve", "--bind", url[7:], "--workers", str(args.workers)]
    runs: list[tuple[WrkResult, WrkResult]] = []
    pg_us: list[tuple[float, float]] = []  # (take, check): the whole PostgreSQL server, per request
    postmaster = postmaster_pid(pg)
    with ExitStack() as stack:
        pid = stack.enter_context(server(cmd, cwd=ROOT, env=env, log=Path(args.log))).pid
        wait_ready(url, "/v1/accounts/acct-1/takes", key)
        warm = [a for a in wrk_args if not a.startswith("-d")] + ["-d3s"]
        run_wrk(url, warm, *TAKE, key)  # every worker connected, queries prepared
        run_wrk(url, warm, *CHECK, key, "GET")
        for rep in range(args.reps):
            got, whole = {}, {}
            for side in ("take", "check") if rep % 2 == 0 else ("check", "take"):
                req = (*TAKE, key) if side == "take" else (*CHECK, key, "GET")
                before = server_cpu(postmaster)
                got[side] = measured(url, ql, pid, wrk_args, *req)
                spent = server_cpu(postmaster) - before
                whole[side] = spent / max(got[side].rps * wrk_seconds(wrk_args), 1) * 1e6
            runs.append((got["take"], got["check"]))
            pg_us.append((whole["take"], whole["check"]))
            print(
                f"rep {rep + 1}: check {got['check']}, pg server {whole['check']:.0f} us;"
                f" take {got['take']}, pg server {whole['take']:.0f} us;"
                f" db ratio {got['check'].db_us / max(got['take'].db_us, 1):.2f}",
                flush=True,
            )

    def line(what: str, ratios: list[float]) -> str:
        runs_ = ", ".join(f"{r:.2f}" for r in ratios)
        return f"  {what}: median {statistics.median(ratios):.2f} (runs {runs_})\n"

    print(
        f"\ncheck / take, CPU per request ({args.wrk}, {args.workers} workers, {args.reps} reps):\n"
        + line(
            "database (the service's backends; target <= 0.5)", [c.db_us / max(t.db_us, 1) for t, c in runs]
        )
        + line("whole PostgreSQL server (bench/server_cpu.py)", [c / max(t, 1) for t, c in pg_us])
        + line("web processes + backends", [cpu(c) / max(cpu(t), 1) for t, c in runs])
        + f"  check: {medians([c for _, c in runs])}\n"
        f"  take:  {medians([t for t, _ in runs])}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
