"""The check's cost against the take's: `GET /v1/accounts/{id}/check?metric=urls` and `POST
/v1/accounts/{id}/takes` under the same `quota-ledger serve --workers 4`, on the same database
(100,000 accounts, a random one per request), with the same wrk settings, alternating which goes
first in each repetition. Measures the server's CPU per request, as `bench/run http` does: the web
processes' and their Postgres backends' (/proc). Target: the check at most 0.5 of the take.

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

from common import server, server_urls, with_database  # noqa: E402
from http_bench import WrkResult, measured, medians, run_wrk, wait_ready  # noqa: E402
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
    with ExitStack() as stack:
        pid = stack.enter_context(server(cmd, cwd=ROOT, env=env, log=Path(args.log))).pid
        wait_ready(url, "/v1/accounts/acct-1/takes", key)
        warm = [a for a in wrk_args if not a.startswith("-d")] + ["-d3s"]
        run_wrk(url, warm, *TAKE, key)  # every worker connected, queries prepared
        run_wrk(url, warm, *CHECK, key, "GET")
        for rep in range(args.reps):
            got = {}
            for side in ("take", "check") if rep % 2 == 0 else ("check", "take"):
                req = (*TAKE, key) if side == "take" else (*CHECK, key, "GET")
                got[side] = measured(url, ql, pid, wrk_args, *req)
            runs.append((got["take"], got["check"]))
            print(
                f"rep {rep + 1}: check {got['check']}; take {got['take']}; "
                f"CPU ratio {cpu(got['check']) / max(cpu(got['take']), 1):.2f}",
                flush=True,
            )
    ratios = [cpu(c) / max(cpu(t), 1) for t, c in runs]
    db = [c.db_us / max(t.db_us, 1) for t, c in runs]
    print(
        f"\ncheck / take ({args.wrk}, {args.workers} workers, {args.reps} reps):"
        f" server CPU per request (app + db) median {statistics.median(ratios):.2f}"
        f" (runs {', '.join(f'{r:.2f}' for r in ratios)}); db alone median {statistics.median(db):.2f}\n"
        f"  check: {medians([c for _, c in runs])}\n"
        f"  take:  {medians([t for t, _ in runs])}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
