"""CPU per HTTP take, block by block: several `serve` variants (and the baseline app) up at once,
wrk blocks alternating among them, and per block each side's CPU per request in its web processes
and in their Postgres backends, its voluntary context switches per request, and its counter
table's HOT updates. For what grows with a run (bench/README.md, "Where the web process's CPU
goes") and for server choices side by side; CPU per request, not throughput, is the figure.

    python bench/http_blocks.py --no-setup --blocks 8 default base
    python bench/http_blocks.py --no-setup threads4='--threads 4' pool16=DB_POOL_SIZE=16 default
    python bench/http_blocks.py --no-setup default granian='granian --interface wsgi ...'

A side is `default` (quota-ledger serve --workers 4), `base` (baseline/app.py under gunicorn -w 4),
or NAME=SPEC, SPEC being `serve` options (starting with --), VAR=VALUE settings for `serve`, or any
other command line ({bind} stands for HOST:PORT, {port} for the port). Uses bench_ql and
bench_bl (--no-setup: as they are, else set up afresh as `bench/run http` does). --restart-after N
restarts every side but the baseline before block N+1: a cost that a restart takes back down lives
in the web process.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import psycopg  # noqa: E402
from common import server, server_urls, with_database  # noqa: E402
from http_bench import LUA, backends, cpu_delta, cpu_seconds, process_tree, switches, wait_ready  # noqa: E402
from take_bench import ACCOUNTS, BASELINE, PLANS_FILE, ROOT, product_key, setup  # noqa: E402


def updates(db_url: str, table: str) -> tuple[int, int]:
    """(updates, HOT updates) of `table` so far (the statistics lag by up to a second)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = %s", (table,)
        ).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sides", nargs="+", help="default, base, or NAME=SPEC")
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--wrk", default="-t2 -c32 -d10s")
    ap.add_argument("--port", type=int, default=8301)
    ap.add_argument("--restart-after", type=int, default=0)
    ap.add_argument("--no-setup", action="store_true", help="reuse bench_ql / bench_bl as they are")
    ap.add_argument("--log", default=str(HERE / "http_bench.log"))
    args = ap.parse_args(argv)
    pg, redis_url = server_urls(ap)
    ql, bl = (with_database(pg, "bench_ql"), with_database(pg, "bench_bl")) if args.no_setup else setup(pg)
    key = product_key(ql)
    py = sys.executable
    sides: dict[str, dict] = {}
    for i, side in enumerate(args.sides):
        name, _, spec = side.partition("=")
        bind = f"127.0.0.1:{args.port + i}"
        if name == "base":
            sides[name] = {
                "cmd": [py, "-m", "gunicorn", "-w", "4", "-b", bind, "app:app"],
                "cwd": BASELINE,
                "env": {**os.environ, "DATABASE_URL": bl},
                "db": bl,
                "path": "/take",
                "table": "bl_usage",
            }
            continue
        env = {**os.environ, "DATABASE_URL": ql, "REDIS_URL": redis_url, "PLANS_FILE": str(PLANS_FILE)}
        env["WEBHOOK_ENVIRONMENT"] = "any"
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        cmd = [py, "-m", "service.cli", "serve", "--bind", bind, "--workers", "4"]
        words = shlex.split(spec)
        if words and not words[0].startswith("--") and "=" not in words[0]:
            # another server: {bind} and {port} filled in, and a metrics folder of its own
            cmd = [w.replace("{bind}", bind).replace("{port}", bind[10:]) for w in words]
            env["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="http-blocks-")
        else:
            cmd += [w for w in words if w.startswith("--") or "=" not in w]
            env.update(w.split("=", 1) for w in words if "=" in w and not w.startswith("--"))
        sides[name] = {
            "cmd": cmd,
            "cwd": ROOT,
            "env": env,
            "db": ql,
            "path": "/v1/accounts/{id}/takes",
            "table": "quotas",
        }
    for i, s in enumerate(sides.values()):
        s["url"] = f"http://127.0.0.1:{args.port + i}"

    def wrk(s: dict, wrk_args: list[str]) -> tuple[int, float, int]:
        cmd = ["wrk", *wrk_args, "-s", str(LUA), s["url"], "--", s["path"], str(ACCOUNTS), key, "POST"]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        non = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
        n = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
        rps = float(re.search(r"Requests/sec:\s+([0-9.]+)", out).group(1))  # type: ignore[union-attr]
        return n, rps, int(non.group(1)) if non else 0

    def start(stack: ExitStack, s: dict) -> None:
        s["stack"] = stack.enter_context(ExitStack())
        s["pid"] = (
            s["stack"].enter_context(server(s["cmd"], cwd=s["cwd"], env=s["env"], log=Path(args.log))).pid
        )
        wait_ready(s["url"], s["path"].replace("{id}", "acct-1"), key, timeout=60)
        wrk(s, [a for a in shlex.split(args.wrk) if not a.startswith("-d")] + ["-d3s"])

    results: dict[str, list[tuple[float, float, float, float]]] = {k: [] for k in sides}
    with ExitStack() as stack:
        for s in sides.values():
            start(stack, s)
        print(f"load average at start: {os.getloadavg()[0]:.1f}", flush=True)
        names = list(sides)
        for b in range(args.blocks):
            if args.restart_after and b == args.restart_after:
                for k, s in sides.items():
                    if k != "base":
                        s["stack"].close()
                        start(stack, s)
                print("-- restarted", flush=True)
            for k in names[b % len(names) :] + names[: b % len(names)]:
                s = sides[k]
                app, db = process_tree(s["pid"]), backends(s["db"])
                a0, d0, v0, u0 = (
                    cpu_seconds(app),
                    cpu_seconds(db),
                    switches(app),
                    updates(s["db"], s["table"]),
                )
                n, rps, non = wrk(s, shlex.split(args.wrk))
                a1, d1, v1, u1 = (
                    cpu_seconds(app),
                    cpu_seconds(db),
                    switches(app),
                    updates(s["db"], s["table"]),
                )
                r = (rps, cpu_delta(a0, a1) / n * 1e6, cpu_delta(d0, d1) / n * 1e6, (v1 - v0) / n)
                results[k].append(r)
                hot = (u1[1] - u0[1]) / max(u1[0] - u0[0], 1) * 100
                print(
                    f"block {b + 1} {k:>10}: {rps:6.0f} req/s, "
                    f"cpu/req app {r[1]:5.0f} us + db {r[2]:5.0f} us, "
                    f"{r[3]:4.1f} switches/req, {s['table']} HOT {hot:3.0f}%, "
                    f"load {os.getloadavg()[0]:.1f}{f', non-2xx {non}' if non else ''}",
                    flush=True,
                )
        print(f"load average at end: {os.getloadavg()[0]:.1f}")
    med = statistics.median
    for k, rs in results.items():
        print(
            f"{k:>10}: median {med(r[0] for r in rs):6.0f} req/s, cpu/req app {med(r[1] for r in rs):5.0f} us"
            f" + db {med(r[2] for r in rs):5.0f} us, {med(r[3] for r in rs):4.1f} switches/req"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
