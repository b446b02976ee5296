"""The usage history over a busy account: `GET /v1/accounts/{id}/usage/history` under
`quota-ledger serve --workers 1`, for a month's range and for the longest (400 days), against
`GET /v1/accounts/{id}/usage` (one indexed read of the counter) on the same server in the same run.

    bench/run history [--rows 100000] [--requests 200] [--no-setup]

Seeds `bench_history` with one account holding ROWS chained `urls` ledger rows spread evenly over the
last 365 days (takes, and the reset row that opens each month, as the service writes them; written
by a PL/pgSQL loop with the migration's ledger_hash(), so the chain is valid), and 1,000 quieter
accounts with 100 rows each around it, so that the index holds other accounts' rows too. Then
REQUESTS sequential requests per route, alternating the routes, one connection each: the medians
and the 95th percentiles in ms, and the history's median over the usage's. Prints the days query's
plan (EXPLAIN ANALYZE, BUFFERS) with the ledger_history index (migrations/0024) and, in a
transaction rolled back, without it: the rows it saves reading.
"""

from __future__ import annotations

import argparse
import http.client
import os
import statistics
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import psycopg  # noqa: E402
from common import recreate_database, server, server_urls, with_database  # noqa: E402
from take_bench import PLANS_FILE, ROOT  # noqa: E402

from service.db import Q  # noqa: E402
from service.keys import create_key  # noqa: E402
from service.migrate import migrate  # noqa: E402

DB = "bench_history"
BUSY = "acct-busy"
QUIET, QUIET_ROWS = 1000, 100
DAYS = 365

# One counter's chain, row by row: each row's hash covers the one before it (ledger_hash, 0009).
SEED = """
DO $$
DECLARE
    n bigint := %(rows)s;
    acct text := '%(account)s';
    t0 timestamptz := date_trunc('day', now()) - interval '%(days)s days';
    step interval := interval '%(days)s days' / n;
    prev bytea := NULL;
    h bytea;
    used bigint := 0;
    per text := NULL;
    at_ timestamptz;
    p text;
    i bigint;
    s bigint := 0;
    id_ bigint;
    kind_ text;
    units_ bigint;
BEGIN
    FOR i IN 1..n LOOP
        at_ := t0 + step * i;
        p := to_char(at_ AT TIME ZONE 'UTC', 'YYYY-MM');
        IF per IS DISTINCT FROM p THEN  -- the month's first row: its reset, then the take
            IF per IS NOT NULL THEN
                s := s + 1; id_ := nextval('ledger_id_seq'); used := 0;
                h := ledger_hash(prev, id_, at_, acct, 'urls', p, 'reset', 0, 0, NULL, NULL,
                                 'period-open:' || p, 'system:monthly_reset');
                INSERT INTO ledger (id, at, seq, account_id, metric, period, kind, units, used_after, actor,
                                    idempotency_key, prev_hash, hash)
                OVERRIDING SYSTEM VALUE
                VALUES (id_, at_, s, acct, 'urls', p, 'reset', 0, 0, 'system:monthly_reset',
                        'period-open:' || p, prev, h);
                prev := h;
            END IF;
            per := p;
        END IF;
        s := s + 1; id_ := nextval('ledger_id_seq'); used := used + 1;
        h := ledger_hash(prev, id_, at_, acct, 'urls', p, 'take', 1, used, NULL, NULL, NULL, 'bench');
        INSERT INTO ledger (id, at, seq, account_id, metric, period, kind, units, used_after, limit_source,
                            actor, prev_hash, hash)
        OVERRIDING SYSTEM VALUE
        VALUES (id_, at_, s, acct, 'urls', p, 'take', 1, used, 'plan', 'bench', prev, h);
        prev := h;
    END LOOP;
    INSERT INTO quotas (account_id, metric, plan_limit, free_limit, period, used, chain_id, chain_at,
                        chain_seq, chain_prev, chain_hash)
    SELECT acct, 'urls', NULL, NULL, per, used, id, at, seq, prev_hash, hash
      FROM ledger WHERE account_id = acct AND metric = 'urls' ORDER BY seq DESC LIMIT 1;
END
$$
"""

# The quiet accounts: rows for the index to hold beside the busy account's, not chained (nothing here
# verifies them), each a take of its own month.
QUIET_SEED = """
INSERT INTO ledger (at, seq, account_id, metric, period, kind, units, used_after, limit_source, actor,
                    prev_hash, hash)
SELECT t, g, 'acct-' || a, 'urls', to_char(t AT TIME ZONE 'UTC', 'YYYY-MM'), 'take', 1, g, 'plan', 'bench',
       CASE WHEN g > 1 THEN sha256(convert_to(a::text || ':' || g - 1, 'UTF8')) END,
       sha256(convert_to(a::text || ':' || g, 'UTF8'))
  FROM generate_series(1, %(accounts)s) a, generate_series(1, %(rows)s) g,
       LATERAL (SELECT now() - interval '%(days)s days' * random() AS t) r
"""


def seed(pg: str, rows: int) -> str:
    url = recreate_database(pg, DB)
    migrate(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO accounts (id, kind, plan) SELECT 'acct-' || g, 'user', 'free'"
            " FROM generate_series(1, %s) g UNION ALL SELECT %s, 'user', 'free'",
            (QUIET, BUSY),
        )
        started = time.monotonic()
        sql = SEED.replace("%(rows)s", str(rows)).replace("%(days)s", str(DAYS))
        conn.execute(sql.replace("%(account)s", BUSY))  # a DO block takes no parameters
        print(f"  {rows:,} chained rows of {BUSY} in {time.monotonic() - started:.0f} s", flush=True)
        conn.execute(QUIET_SEED.replace("%(days)s", str(DAYS)), {"accounts": QUIET, "rows": QUIET_ROWS})
        conn.execute("VACUUM ANALYZE")
    return url


def explain(db: str, first: datetime, last: datetime) -> None:
    """The days query's plan with the index, and without it (dropped in a transaction rolled back)."""
    params = {"account_id": BUSY, "metric": "urls", "start": first, "end": last}
    with psycopg.connect(db) as conn:
        for label in ("with ledger_history", "without it"):
            if label == "without it":
                conn.execute("DROP INDEX ledger_history")
            plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + Q.usage_history_days, params)
            print(f"\nthe days query over 31 days, {label}:")
            for (line,) in plan.fetchall():
                print("   ", line)
        conn.rollback()


def timed_get(conn: http.client.HTTPConnection, path: str, key: str) -> float:
    started = time.perf_counter()
    conn.request("GET", path, headers={"Authorization": f"Bearer {key}"})
    resp = conn.getresponse()
    body = resp.read()
    elapsed = (time.perf_counter() - started) * 1000
    if resp.status != 200:
        raise RuntimeError(f"{path}: {resp.status} {body[:300]!r}")
    return elapsed


def summary(ms: list[float]) -> str:
    p95 = statistics.quantiles(ms, n=20)[-1] if len(ms) >= 20 else max(ms)
    return f"median {statistics.median(ms):6.2f} ms, p95 {p95:6.2f} ms"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--port", type=int, default=8124)
    ap.add_argument("--no-setup", action="store_true", help=f"reuse {DB} as it is")
    ap.add_argument("--log", default=str(HERE / "history_bench.log"), help="server output goes here")
    args = ap.parse_args(argv)
    pg, redis_url = server_urls(ap)
    if args.no_setup:
        db = with_database(pg, DB)
    else:
        print(f"seeding {DB}: {args.rows:,} ledger rows of one account over {DAYS} days ...", flush=True)
        db = seed(pg, args.rows)
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(
            "UPDATE api_keys SET revoked_at = now() WHERE name = 'bench-product' AND revoked_at IS NULL"
        )
        key = create_key(conn, name="bench-product", role="product", actor="system:bench")
    today = datetime.now(UTC).date()
    history = f"/v1/accounts/{BUSY}/usage/history?metric=urls"
    routes = {
        "usage (baseline)": f"/v1/accounts/{BUSY}/usage?metric=urls",
        "history, 31 days": f"{history}&from={today - timedelta(days=30)}&to={today}",
        "history, 400 days": f"{history}&from={today - timedelta(days=399)}&to={today}",
    }
    env = {**os.environ, "DATABASE_URL": db, "REDIS_URL": redis_url, "PLANS_FILE": str(PLANS_FILE)}
    env["WEBHOOK_ENVIRONMENT"] = "any"
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    serve = [
        sys.executable,
        "-m",
        "service.cli",
        "serve",
        "--bind",
        f"127.0.0.1:{args.port}",
        "--workers",
        "1",
    ]
    times: dict[str, list[float]] = {name: [] for name in routes}
    with server(serve, cwd=ROOT, env=env, log=Path(args.log)):
        deadline = time.time() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{args.port}/healthz", timeout=2).read()
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.3)
        conn = http.client.HTTPConnection("127.0.0.1", args.port, timeout=30)
        for path in routes.values():  # warm: the plan cache, the key cache, the pages
            timed_get(conn, path, key)
        for _ in range(args.requests):
            for name, path in routes.items():
                times[name].append(timed_get(conn, path, key))
        conn.close()
    base = statistics.median(times["usage (baseline)"])
    print(f"\n{args.requests} requests each, sequential, one connection:")
    for name, ms in times.items():
        print(f"  {name:18} {summary(ms)}   {statistics.median(ms) / base:5.1f}x the usage read")
    first = datetime.combine(today - timedelta(days=30), datetime.min.time(), tzinfo=UTC)
    explain(db, first, first + timedelta(days=31))
    return 0


if __name__ == "__main__":
    sys.exit(main())
