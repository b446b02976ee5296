"""Take latency at a fixed offered load, open loop: `POST /v1/accounts/{id}/takes` under `quota-ledger
serve` against baseline/app.py under gunicorn (the same worker count), in the same run, on the same
Postgres, alternating which goes first.

    bench/run latency [--rate 1000] [--seconds 20] [--reps 3]

A closed-loop load generator (wrk) waits for an answer before it sends the next request, so a
stalled server is sent less and its stall hides in a few slow samples (coordinated omission). Here
requests are scheduled at fixed times (RATE per second) whatever the server does, and sent on the
first of CONNECTIONS keep-alive connections to be free (as wrk2 does); a request's latency runs
from its scheduled time to the end of its answer, so a request that waited for a connection counts
its wait. A connection the server closes (gunicorn's sync workers close each) is opened again, and
that too is part of the latency. Prints p50, p99 and p99.9 of each side per repetition, and the median of the
per-repetition p99 ratios (issue 24's target: ours <= 1.5x the baseline's).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import server, server_urls, with_database  # noqa: E402
from http_bench import wait_ready  # noqa: E402
from take_bench import ACCOUNTS, BASELINE, PLANS_FILE, ROOT, product_key, setup  # noqa: E402

BODY = b'{"metric": "urls"}'


class Side:
    def __init__(self, host: str, port: int, path: str, key: str, accounts: int) -> None:
        self.host, self.port, self.path, self.key, self.accounts = host, port, path, key, accounts
        self.errors = 0

    def request(self) -> bytes:
        path = self.path.replace("{id}", f"acct-{random.randint(1, self.accounts)}")
        return (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nAuthorization: Bearer {self.key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n"
        ).encode() + BODY

    async def connection(self, due: Iterator[float], latencies: list[float]) -> None:
        """One connection's loop: the next request of the schedule, sent at its time (or as soon as
        this connection is free, when it is late: the wait counts in its latency), until the
        schedule ends. A connection the server closes is opened again."""
        conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        for at in due:
            delay = at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                if conn is None:
                    conn = await asyncio.open_connection(self.host, self.port)
                reader, writer = conn
                writer.write(self.request())
                status = (await reader.readline()).split(b" ", 2)
                length, close = 0, False
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.partition(b":")
                    name = name.strip().lower()
                    if name == b"content-length":
                        length = int(value)
                    elif name == b"connection" and value.strip().lower() == b"close":
                        close = True
                await reader.readexactly(length)
                latencies.append(time.monotonic() - at)
                if len(status) < 2 or status[1] not in (b"200", b"201"):
                    self.errors += 1
                if close:
                    writer.close()
                    conn = None
            except (OSError, asyncio.IncompleteReadError, ValueError):
                self.errors += 1
                conn = None
        if conn is not None:
            conn[1].close()

    async def run(self, rate: float, seconds: float, connections: int) -> list[float]:
        latencies: list[float] = []
        start = time.monotonic() + 0.1
        due = (start + i / rate for i in range(int(rate * seconds)))  # shared: each time taken once
        await asyncio.gather(*(self.connection(due, latencies) for _ in range(connections)))
        return latencies


def percentile(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p / 100))] * 1000


def measure(
    side: Side, rate: float, seconds: float, connections: int
) -> tuple[float, float, float, int, float]:
    """p50, p99, p99.9 (ms), errors, and the rate actually answered."""
    side.errors = 0
    t0 = time.monotonic()
    lat = asyncio.run(side.run(rate, seconds, connections))
    took = time.monotonic() - t0
    return percentile(lat, 50), percentile(lat, 99), percentile(lat, 99.9), side.errors, len(lat) / took


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=1000, help="takes per second offered")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--connections", type=int, default=32, help="the load generator's connections")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--port", type=int, default=8131, help="ours on PORT, the baseline on PORT+1")
    ap.add_argument("--no-setup", action="store_true", help="reuse bench_ql / bench_bl as they are")
    ap.add_argument("--log", default=str(HERE / "latency_bench.log"), help="server output goes here")
    args = ap.parse_args(argv)
    pg, redis_url = server_urls(ap)
    if args.no_setup:
        ql, bl = with_database(pg, "bench_ql"), with_database(pg, "bench_bl")
    else:
        print("setting up bench_ql and bench_bl ...", flush=True)
        ql, bl = setup(pg)
    key = product_key(ql)
    py = sys.executable
    env = {**os.environ, "DATABASE_URL": ql, "REDIS_URL": redis_url, "PLANS_FILE": str(PLANS_FILE)}
    env["WEBHOOK_ENVIRONMENT"] = "any"
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    ours_bind, base_bind = f"127.0.0.1:{args.port}", f"127.0.0.1:{args.port + 1}"
    ours_cmd = [py, "-m", "service.cli", "serve", "--bind", ours_bind, "--workers", str(args.workers)]
    base_cmd = [py, "-m", "gunicorn", "-w", str(args.workers), "-b", base_bind, "app:app"]
    sides = {
        "ours": Side("127.0.0.1", args.port, "/v1/accounts/{id}/takes", key, ACCOUNTS),
        "baseline": Side("127.0.0.1", args.port + 1, "/take", key, ACCOUNTS),
    }
    ratios = []
    got: dict[str, list[tuple[float, float, float, int, float]]] = {"ours": [], "baseline": []}
    with ExitStack() as stack:
        stack.enter_context(server(ours_cmd, cwd=ROOT, env=env, log=Path(args.log)))
        stack.enter_context(
            server(base_cmd, cwd=BASELINE, env={**os.environ, "DATABASE_URL": bl}, log=Path(args.log))
        )
        wait_ready(f"http://{ours_bind}", "/v1/accounts/acct-1/takes", key)
        wait_ready(f"http://{base_bind}", "/take", key)
        for side in sides.values():  # warm: every worker connected, statements prepared
            measure(side, args.rate, 3, args.connections)
        for rep in range(args.reps):
            order = ["baseline", "ours"] if rep % 2 == 0 else ["ours", "baseline"]
            this = {name: measure(sides[name], args.rate, args.seconds, args.connections) for name in order}
            for name, r in this.items():
                got[name].append(r)
            ratios.append(this["ours"][1] / this["baseline"][1])
            print(
                f"rep {rep + 1}: "
                + "; ".join(
                    f"{name} p50 {r[0]:.1f} ms, p99 {r[1]:.1f} ms, p99.9 {r[2]:.1f} ms, "
                    f"{r[4]:,.0f}/s answered" + (f", {r[3]} errors" if r[3] else "")
                    for name, r in this.items()
                )
                + f"; p99 ratio {ratios[-1]:.2f}",
                flush=True,
            )
    med = statistics.median
    print(
        f"\n{args.rate:,.0f} takes/s offered, open loop, {args.connections} connections, "
        f"{args.seconds:.0f} s x {args.reps} reps, {args.workers} workers:"
    )
    for name, rs in got.items():
        print(
            f"  {name:8} p50 {med(r[0] for r in rs):.1f} ms, p99 {med(r[1] for r in rs):.1f} ms, "
            f"p99.9 {med(r[2] for r in rs):.1f} ms"
        )
    print(f"  p99 ours / baseline: median {med(ratios):.2f} (runs {', '.join(f'{r:.2f}' for r in ratios)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
