"""Database outage benchmark: how the web tier behaves while Postgres is down, and how fast it is
back when Postgres returns.

    .venv/bin/python bench/outage.py [--outage 40] [--reps 3] [--workers 4] [--clients 8]

Starts a private PostgreSQL cluster (initdb into a temporary directory, a free port; never the
machine's own server, which it does not touch) and `quota-ledger serve --workers N` on it. Per
repetition: `--clients` threads take units back to back and one thread probes /readyz every
0.2 s; Postgres is stopped (`pg_ctl stop -m fast`: every session ends, as in a restart or a
failover) for `--outage` seconds, then started. Reports per repetition and as medians:

- the latency of the answers while it is down (all must be 503 with the JSON error), median and max;
- the slowest /readyz while it is down;
- seconds from Postgres accepting connections again to the first successful take, and to the last
  failed one (every worker's pool back).

With --pgbouncer [K=V,...] the service connects through a PgBouncer in transaction mode (prepared
statements off), with those settings on top of PgBouncer's defaults. Redis is not needed: REDIS_URL may point
anywhere (it only feeds /readyz's informational line).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from tests.faults.outage import ACCOUNT, prepare, run_outage, serve_env  # noqa: E402
from tests.servers import PgBouncer, PrivatePostgres, Serve  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--outage", type=float, default=40.0, help="seconds Postgres stays down")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--workers", type=int, default=4, help="serve workers (the serve default)")
    ap.add_argument("--clients", type=int, default=8, help="threads taking back to back")
    ap.add_argument(
        "--pgbouncer",
        nargs="?",
        const="",
        metavar="K=V,...",
        help="serve through PgBouncer (transaction mode, DB_PREPARED_STATEMENTS=off), with these "
        "settings on top of its defaults (e.g. server_login_retry=1)",
    )
    args = ap.parse_args()

    load = os.getloadavg()[0]
    via = "" if args.pgbouncer is None else f" through PgBouncer ({args.pgbouncer or 'defaults'})"
    print(
        f"outage benchmark{via}: {args.reps} x {args.outage:.0f} s outage, serve --workers {args.workers}, "
        f"{args.clients} clients; load average {load:.1f} on {os.cpu_count()} CPUs at start",
        flush=True,
    )
    pg = PrivatePostgres()
    log = Path(tempfile.mkstemp(prefix="ql-outage-serve-", suffix=".log")[1])
    with contextlib.ExitStack() as stack:
        stack.callback(pg.close)
        with psycopg.connect(pg.url(), autocommit=True) as c:
            c.execute("CREATE DATABASE ql")
        headers = prepare(pg.url("ql"))
        redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
        if args.pgbouncer is not None:
            extra = dict(kv.split("=", 1) for kv in args.pgbouncer.split(",") if kv)
            bouncer = PgBouncer(pg.url(), settings=extra)
            stack.callback(bouncer.close)
            env = serve_env(bouncer.url("ql"), redis_url, DB_PREPARED_STATEMENTS="off")
        else:
            env = serve_env(pg.url("ql"), redis_url)
        srv = Serve(env, workers=args.workers, log=log)
        stack.callback(srv.close)
        rows = []
        for rep in range(1, args.reps + 1):
            out = run_outage(
                pg, srv.base, headers=headers, account=ACCOUNT, outage_seconds=args.outage,
                clients=args.clients, warm_seconds=3.0,
            )  # fmt: skip
            s = out.summary()
            rows.append(s)
            print(f"rep {rep}: {s}", flush=True)

    def med(key: str) -> float:
        values = [float(r[key]) for r in rows if r[key] is not None]
        return statistics.median(values) if values else float("nan")

    print(
        f"\nmedians over {args.reps} reps of a {args.outage:.0f} s outage: answers while down "
        f"{med('take_latency_during_median_s') * 1000:.0f} ms median, "
        f"{med('take_latency_during_p99_s') * 1000:.0f} ms p99, "
        f"{med('take_latency_during_max_s'):.2f} s max (all 503 JSON: "
        f"{'yes' if all(r['not_503_json_during'] == 0 for r in rows) else 'NO'}); "
        f"slowest /readyz {med('readyz_during_max_s') * 1000:.0f} ms; first success "
        f"{med('first_success_after_s'):.2f} s after Postgres was back, last failure "
        f"{med('last_failure_after_s'):.2f} s after"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
