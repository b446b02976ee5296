"""Finance's tools over a large ledger: the CSV export of a period through `GET /v1/ledger.csv` and
through `quota-ledger ledger export`, and `quota-ledger ledger verify`.

    bench/run ledger [--rows 1000000] [--reps 3]   (or: python bench/ledger_tools_bench.py ...)

Seeds `bench_ledger` with ROWS chained ledger rows in the current period (10 takes on each of
ROWS/10 counters, written set-based with the migration's ledger_hash(), so the chain is what the
service writes), then per repetition:

  export, command   `quota-ledger ledger export --period P --output FILE`: rows/s, peak RSS (kernel's
                    max RSS of the process, from wait4)
  export, endpoint  `quota-ledger serve --workers 1`, one streamed GET /v1/ledger.csv read to the end
                    by this script: rows/s, the worker's RSS before and its peak (VmHWM) after
  COPY reference    `psql \\copy (SELECT the same columns) TO FILE CSV`: what Postgres alone does
  verify            `quota-ledger ledger verify`: rows/s, peak RSS

Targets: export peak RSS flat (the same at any row count) and under 150 MB; rows/s reported.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import psycopg  # noqa: E402
from common import recreate_database, server, server_urls, with_database  # noqa: E402
from take_bench import PLANS_FILE, ROOT  # noqa: E402

from service.keys import create_key  # noqa: E402
from service.migrate import migrate  # noqa: E402
from service.quota import periods  # noqa: E402

DB = "bench_ledger"
ROWS_PER_COUNTER = 10

STEP = """
WITH drawn AS (
    SELECT account_id, nextval('ledger_id_seq') AS id, clock_timestamp() AS at, hash AS prev,
           used + 1 AS used_after, seq + 1 AS seq
      FROM heads
), written AS (
    INSERT INTO ledger (id, at, seq, account_id, metric, period, kind, units, used_after, lim, limit_source,
                        actor, prev_hash, hash)
    OVERRIDING SYSTEM VALUE
    SELECT id, at, seq, account_id, 'urls', %(period)s, 'take', 1, used_after, NULL, 'plan', 'bench', prev,
           ledger_hash(prev, id, at, account_id, 'urls', %(period)s, 'take', 1, used_after, NULL, NULL, NULL,
                       'bench')
      FROM drawn
 RETURNING account_id, id, at, seq, prev_hash, hash, used_after
)
UPDATE heads h
   SET id = w.id, at = w.at, seq = w.seq, prev = w.prev_hash, hash = w.hash, used = w.used_after
  FROM written w
 WHERE h.account_id = w.account_id
"""


def seed(pg: str, rows: int) -> str:
    url = recreate_database(pg, DB)
    migrate(url)
    counters = max(rows // ROWS_PER_COUNTER, 1)
    period = periods.current_period()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO accounts (id, kind, plan) SELECT 'acct-' || g, 'user', 'free'"
            " FROM generate_series(1, %s) g",
            (counters,),
        )
        conn.execute(
            "CREATE TEMP TABLE heads (account_id text PRIMARY KEY, id bigint, at timestamptz, prev bytea,"
            " hash bytea, used bigint NOT NULL DEFAULT 0, seq bigint NOT NULL DEFAULT 0)"
        )
        conn.execute(
            "INSERT INTO heads (account_id) SELECT 'acct-' || g FROM generate_series(1, %s) g", (counters,)
        )
        for step in range(ROWS_PER_COUNTER):
            conn.execute(STEP, {"period": period})
            print(f"  seeded {(step + 1) * counters:,} rows", file=sys.stderr, flush=True)
        conn.execute(
            "INSERT INTO quotas (account_id, metric, plan_limit, free_limit, period, used,"
            "                    chain_id, chain_at, chain_seq, chain_prev, chain_hash)"
            " SELECT account_id, 'urls', NULL, NULL, %s, used, id, at, seq, prev, hash FROM heads",
            (period,),
        )
        conn.execute("VACUUM ANALYZE")
    return url


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, int, str]:
    """Wall seconds, peak RSS in MB (the kernel's ru_maxrss of this child) and stdout."""
    with tempfile.TemporaryFile() as out:
        started = time.monotonic()
        p = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.DEVNULL, cwd=ROOT)
        _, status, usage = os.wait4(p.pid, 0)
        elapsed = time.monotonic() - started
        out.seek(0)
        text = out.read().decode()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{cmd} failed: {text[-500:]}")
    return elapsed, usage.ru_maxrss // 1024, text


def status_mb(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def endpoint_export(url: str, key: str, period: str) -> tuple[float, int]:
    """Seconds and rows (CSV lines after the header) of one streamed GET /v1/ledger.csv."""
    req = urllib.request.Request(
        f"{url}/v1/ledger.csv?period={period}", headers={"Authorization": f"Bearer {key}"}
    )
    started = time.monotonic()
    lines = 0
    with urllib.request.urlopen(req, timeout=3600) as resp:
        while chunk := resp.read(1 << 16):
            lines += chunk.count(b"\n")
    return time.monotonic() - started, lines - 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--port", type=int, default=8121)
    ap.add_argument("--no-setup", action="store_true", help=f"reuse {DB} as it is")
    ap.add_argument("--log", default=str(HERE / "ledger_tools_bench.log"), help="server output goes here")
    args = ap.parse_args(argv)
    pg, redis_url = server_urls(ap)
    if args.no_setup:
        db = with_database(pg, DB)
    else:
        print(f"seeding {DB} with {args.rows:,} chained ledger rows ...", flush=True)
        db = seed(pg, args.rows)
    period = periods.current_period()
    with psycopg.connect(db, autocommit=True) as conn:
        rows = conn.execute("SELECT count(*) FROM ledger WHERE period = %s", (period,)).fetchone()[0]  # type: ignore[index]
        conn.execute(
            "UPDATE api_keys SET revoked_at = now() WHERE name = 'bench-finance' AND revoked_at IS NULL"
        )
        key = create_key(conn, name="bench-finance", role="finance", actor="system:bench")
    env = {**os.environ, "DATABASE_URL": db, "REDIS_URL": redis_url, "PLANS_FILE": str(PLANS_FILE)}
    env["WEBHOOK_ENVIRONMENT"] = "any"  # serve refuses to start without one; no webhook is sent here
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    py = sys.executable
    out_file = Path(tempfile.mkdtemp(prefix="bench-ledger-")) / "export.csv"
    results: dict[str, list[tuple[float, float]]] = {"command": [], "endpoint": [], "copy": [], "verify": []}
    url = f"http://127.0.0.1:{args.port}"
    serve = [py, "-m", "service.cli", "serve", "--bind", url[7:], "--workers", "1"]
    with server(serve, cwd=ROOT, env=env, log=Path(args.log)) as srv:
        deadline = time.time() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/healthz", timeout=2).read()
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.3)
        for rep in range(args.reps):
            secs, rss, _ = timed(
                [py, "-m", "service.cli", "ledger", "export", "--period", period, "--output", str(out_file)],
                env,
            )
            results["command"].append((rows / secs, rss))
            print(f"rep {rep + 1} export command: {rows / secs:,.0f} rows/s, peak RSS {rss} MB", flush=True)

            [worker] = children(srv.pid)
            before = status_mb(worker, "VmRSS")
            secs, got = endpoint_export(url, key, period)
            assert got == rows, (got, rows)
            peak = status_mb(worker, "VmHWM")
            results["endpoint"].append((rows / secs, peak))
            print(
                f"rep {rep + 1} export endpoint: {rows / secs:,.0f} rows/s,"
                f" worker RSS {before:.0f} MB before,"
                f" peak {peak:.0f} MB",
                flush=True,
            )

            copy = (
                f"\\copy (SELECT id, at, account_id, metric, period, kind, units, used_after, lim, take_id,"
                f" idempotency_key, actor, encode(prev_hash, 'hex'), encode(hash, 'hex') FROM ledger"
                f" WHERE period = '{period}' ORDER BY id) TO '{out_file}' CSV HEADER"
            )
            secs, rss, _ = timed(["psql", "-q", "-c", copy, db], env)
            results["copy"].append((rows / secs, rss))
            print(f"rep {rep + 1} COPY reference: {rows / secs:,.0f} rows/s", flush=True)

            secs, rss, text = timed([py, "-m", "service.cli", "ledger", "verify"], env)
            assert text.rstrip().endswith(": OK"), text[-300:]
            results["verify"].append((rows / secs, rss))
            print(f"rep {rep + 1} verify: {rows / secs:,.0f} rows/s, peak RSS {rss} MB", flush=True)
    out_file.unlink(missing_ok=True)
    med = statistics.median
    print(f"\n{rows:,} ledger rows, {args.reps} reps, medians:")
    for name, label in (
        ("command", "export, `quota-ledger ledger export`"),
        ("endpoint", "export, GET /v1/ledger.csv (1 gunicorn worker)"),
        ("copy", "reference: psql \\copy of the same columns"),
        ("verify", "`quota-ledger ledger verify`"),
    ):
        rate = med(r for r, _ in results[name])
        rss = max(m for _, m in results[name])
        tail = "" if name == "copy" else f", peak RSS {rss:.0f} MB (max over reps)"
        print(f"  {label}: {rate:,.0f} rows/s{tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
