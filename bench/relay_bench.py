"""Events out: the relay's throughput to a local receiver, against the same HTTP alone in the same run.

    bench/run relay [--events 3000] [--workers 4] [--reps 3] [--db bench_relay]

Needs DATABASE_URL (any database on the server, as a role that may create databases: this drops and
creates the scratch database DB and migrates it). Run by hand; it is not a test.

Each repetition writes --events events into event_outbox (one INSERT, as the owner), then times
`quota-ledger relay --once --workers W --per-endpoint W` (process start, fan-out, then every event
claimed, signed, sent to the receiver and recorded, one transaction each) until every delivery is
delivered. The baseline sends the same number of bodies of the same size to the same receiver from W
threads, one connection per request as the relay opens (it connects to the address it checked
every time), and nothing else: what the HTTP alone costs on this machine. The receiver, a
ThreadingHTTPServer in a process of its own, answers 204 to each. Prints each repetition and the
medians: events/s, and the ratio to the baseline's requests/s.
"""

from __future__ import annotations

import argparse
import http.client
import os
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "bench"), str(ROOT)]
from common import recreate_database, server_urls  # noqa: E402

# n events of the largest kind's shape, spread over 1,000 accounts (%% : psycopg's literal %)
EVENTS = """
INSERT INTO event_outbox (account_id, type, data)
SELECT 'acc-' || (n %% 1000), 'quota.threshold_crossed',
       jsonb_build_object('account_id', 'acc-' || (n %% 1000), 'metric', 'urls', 'period', '2026-12',
                          'threshold', 80, 'used', 80, 'limit', 100, 'occurred_at', now())
  FROM generate_series(1, %s) AS n
"""


def receive(port: int) -> None:
    """The receiver's process: answer 204 to every POST, forever."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.request_queue_size = 128
    server.daemon_threads = True
    server.serve_forever()


def baseline(port: int, n: int, workers: int, size: int) -> float:
    """Seconds for n POSTs of `size` bytes from `workers` threads, a connection each."""
    body = b"x" * size
    left = list(range(n))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                if not left:
                    return
                left.pop()
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            c.request("POST", "/hooks", body=body, headers={"Content-Type": "application/json"})
            assert c.getresponse().status == 204
            c.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=work) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - started


def relay_once(url: str, n: int, workers: int) -> tuple[float, int]:
    """Seconds for `relay --once` to deliver n new events, and the body size."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(EVENTS, (n,))
    env = {**os.environ, "DATABASE_URL": url, "WEBHOOK_OUT_ALLOW_PRIVATE": "true"}
    argv = [sys.executable, "-m", "service.cli", "relay", "--once", "--workers", str(workers)]
    argv += ["--per-endpoint", str(workers)]
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=ROOT)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"relay failed: {done.stderr[-2000:]}")
    with psycopg.connect(url, autocommit=True) as conn:
        pending = conn.execute(
            "SELECT count(*) FROM webhook_deliveries WHERE status <> 'delivered'"
        ).fetchone()
        size = conn.execute("SELECT max(octet_length(body)) FROM webhook_deliveries").fetchone()
        conn.execute("DELETE FROM webhook_deliveries")
        conn.execute("DELETE FROM event_outbox")
    assert pending and pending[0] == 0, f"{pending} deliveries not delivered"
    return elapsed, int(size[0]) if size else 200


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=3000)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--db", default="bench_relay")
    ap.add_argument("--receive", type=int, help=argparse.SUPPRESS)  # the receiver's own process
    args = ap.parse_args()
    if args.receive:
        receive(args.receive)
        return
    pg, _ = server_urls(ap)
    from service.events import endpoints
    from service.migrate import migrate

    url = recreate_database(pg, args.db)
    migrate(url)
    port = free_port()
    receiver = subprocess.Popen([sys.executable, __file__, "--receive", str(port)])
    try:
        time.sleep(1.0)
        with psycopg.connect(url, autocommit=True) as conn:
            endpoints.create(
                conn,
                url=f"http://127.0.0.1:{port}/hooks",
                events=["quota.threshold_crossed"],
                allow_private=True,
                actor="bench",
            )
        ours, base = [], []
        for rep in range(args.reps):
            seconds, size = relay_once(url, args.events, args.workers)
            ours.append(args.events / seconds)
            base.append(args.events / baseline(port, args.events, args.workers, size))
            print(
                f"rep {rep + 1}: relay {ours[-1]:,.0f} events/s, HTTP alone {base[-1]:,.0f} requests/s, "
                f"ratio {ours[-1] / base[-1]:.2f}",
                flush=True,
            )
    finally:
        receiver.terminate()
        receiver.wait()
    ratios = [o / b for o, b in zip(ours, base, strict=True)]
    print(
        f"median: relay {statistics.median(ours):,.0f} events/s "
        f"({args.events} events, {args.workers} workers), "
        f"HTTP alone {statistics.median(base):,.0f} requests/s, ratio {statistics.median(ratios):.2f}"
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, for the receiver to bind."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    main()
