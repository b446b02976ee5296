"""HTTP take benchmark: `POST /v1/accounts/{id}/takes` under `quota-ledger serve --workers 4` (auth,
validation, ledger and metrics all on) against baseline/app.py under gunicorn with the same worker
count, in the same run, on the same Postgres, with the same wrk settings and the same requests.

    bench/run http [--reps 5] [--wrk "-t2 -c32 -d10s"]   (or: python bench/http_bench.py ...)

Two phases: `spread` (a random account among 100,000 per request; baseline app.py `/take`) and `hot`
(every request on one account; baseline app_hot.py `/take_hot`, which runs take_hot.sql). Each
repetition runs both servers' wrk runs back to back, alternating which goes first. Prints every run,
then medians of throughput, p50 and p99, and the median of the per-repetition throughput ratios.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import psycopg  # noqa: E402
from common import server, server_urls, wrk_ms, wrk_seconds  # noqa: E402
from take_bench import (  # noqa: E402
    ACCOUNTS,
    BASELINE,
    PLANS_FILE,
    ROOT,
    product_key,
    setup,
    with_database,
)

LUA = HERE / "http_take.lua"


@dataclass(frozen=True)
class WrkResult:
    rps: float
    p50_ms: float
    p99_ms: float
    non_2xx: int
    errors: str
    app_us: float = 0.0  # CPU of the web server's processes per request (microseconds)
    db_us: float = 0.0  # CPU of its Postgres backends per request
    # wrk's connections held by each of the server's processes halfway through the run, most first
    # ("24/6/2/0": a keep-alive connection stays on the worker that accepted it; bench/README.md)
    spread: str = ""
    switches: float = 0.0  # voluntary context switches of the web server's threads per request

    def __str__(self) -> str:
        bad = f", non-2xx {self.non_2xx}" if self.non_2xx else ""
        return (
            f"{self.rps:,.0f} req/s, p50 {self.p50_ms:.1f} ms, p99 {self.p99_ms:.1f} ms, "
            f"cpu/req app {self.app_us:.0f} us + db {self.db_us:.0f} us{bad}{self.errors}"
            + (f", {self.switches:.1f} switches/req" if self.switches else "")
            + (f", connections {self.spread}" if self.spread else "")
        )


TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pids: list[int]) -> dict[int, float]:
    """user + system CPU seconds of each of these processes so far (Linux /proc; empty elsewhere)."""
    out = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        out[pid] = (int(fields[11]) + int(fields[12])) / TICK
    return out


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU spent between two readings by the processes alive at both."""
    return sum(after[p] - before[p] for p in before.keys() & after.keys())


def process_tree(root: int) -> list[int]:
    """root and its descendants (Linux /proc)."""
    parent: dict[int, int] = {}
    for d in Path("/proc").glob("[0-9]*"):
        try:
            parent[int(d.name)] = int((d / "stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    tree, todo = [root], [root]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        tree += kids
        todo += kids
    return tree


def switches(pids: list[int]) -> int:
    """Voluntary context switches so far of these processes' threads (Linux /proc)."""
    total = 0
    for pid in pids:
        try:
            for task in Path(f"/proc/{pid}/task").iterdir():
                for line in (task / "status").read_text().splitlines():
                    if line.startswith("voluntary_ctxt_switches"):
                        total += int(line.split()[1])
        except OSError:
            continue
    return total


def backends(db_url: str) -> list[int]:
    """Pids of the client backends connected to db_url's database (the server's pool)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
        ).fetchall()
    return [int(r[0]) for r in rows]


def connections(pids: list[int], port: int) -> list[int]:
    """Established TCP connections to local `port` held by each of `pids`, most first, processes
    holding none left out (Linux /proc; empty elsewhere)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "01" and int(f[1].rsplit(":", 1)[1], 16) == port:  # ESTABLISHED, on our side
                inodes.add(f[9])
    held = []
    for pid in pids:
        try:
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue
        n = sum(1 for link in links if link.startswith("socket:[") and link[8:-1] in inodes)
        if n:
            held.append(n)
    return sorted(held, reverse=True)


def measured(url: str, db_url: str, server_pid: int, wrk_args: list[str], *req: object) -> WrkResult:
    """run_wrk, plus the CPU the server's processes and their Postgres backends spent per request,
    and how wrk's connections fell on the server's processes."""
    app, db = process_tree(server_pid), backends(db_url)
    a0, d0, s0 = cpu_seconds(app), cpu_seconds(db), switches(app)
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    held: list[int] = []

    def halfway() -> None:
        time.sleep(wrk_seconds(wrk_args) / 2)
        held[:] = connections(app, port)

    r = run_wrk(url, wrk_args, *req, during=halfway)  # type: ignore[arg-type,misc]
    a1, d1, s1 = cpu_seconds(app), cpu_seconds(db), switches(app)
    n = max(r.rps * wrk_seconds(wrk_args), 1)
    return dataclasses.replace(
        r,
        app_us=cpu_delta(a0, a1) / n * 1e6,
        db_us=cpu_delta(d0, d1) / n * 1e6,
        spread="/".join(map(str, held)),
        switches=(s1 - s0) / n,
    )


def run_wrk(
    url: str,
    wrk_args: list[str],
    template: str,
    accounts: int,
    key: str,
    method: str = "POST",
    during: Callable[[], None] | None = None,
) -> WrkResult:
    """wrk's figures for one run; `during` is called while wrk runs."""
    cmd = ["wrk", *wrk_args, "--latency", "-s", str(LUA), url, "--", template, str(accounts), key, method]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as p:
        if during is not None:
            during()
        out = p.communicate()[0]
    if p.returncode:
        raise subprocess.CalledProcessError(p.returncode, cmd, out)
    rps = float(re.search(r"Requests/sec:\s+([0-9.]+)", out).group(1))  # type: ignore[union-attr]
    p50 = wrk_ms(re.search(r"^\s+50%\s+(\S+)", out, re.M).group(1))  # type: ignore[union-attr]
    p99 = wrk_ms(re.search(r"^\s+99%\s+(\S+)", out, re.M).group(1))  # type: ignore[union-attr]
    non = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    err = re.search(r"Socket errors:.*", out)
    return WrkResult(rps, p50, p99, int(non.group(1)) if non else 0, f", {err.group(0)}" if err else "")


def medians(results: list[WrkResult]) -> str:
    med = statistics.median
    return (
        f"{med(r.rps for r in results):,.0f} req/s, p50 {med(r.p50_ms for r in results):.1f} ms, "
        f"p99 {med(r.p99_ms for r in results):.1f} ms; cpu/req app {med(r.app_us for r in results):.0f} us"
        f" + db {med(r.db_us for r in results):.0f} us"
    )


def wait_ready(url: str, path: str, key: str, timeout: float = 30) -> None:
    deadline = time.time() + timeout
    while True:
        req = urllib.request.Request(
            url + path,
            data=b'{"metric": "urls"}',
            method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
        )
        try:
            with urllib.request.urlopen(req, timeout=2) as resp:
                if resp.status in (200, 201):
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            if time.time() > deadline:
                raise RuntimeError(f"{url}{path} not ready: {e}") from None
        time.sleep(0.3)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--wrk", default="-t2 -c32 -d10s", help="wrk settings, the same for both servers")
    ap.add_argument("--port", type=int, default=8101, help="ours on PORT, the baseline on PORT+1")
    ap.add_argument("--phases", nargs="+", default=["spread", "hot"], choices=["spread", "hot"])
    ap.add_argument("--no-setup", action="store_true", help="reuse bench_ql / bench_bl as they are")
    ap.add_argument("--log", default=str(HERE / "http_bench.log"), help="server output goes here")
    args = ap.parse_args(argv)
    pg, redis_url = server_urls(ap)
    if args.no_setup:
        ql, bl = with_database(pg, "bench_ql"), with_database(pg, "bench_bl")
    else:
        print("setting up bench_ql and bench_bl ...", flush=True)
        ql, bl = setup(pg)
    key = product_key(ql)
    wrk_args = shlex.split(args.wrk)
    log = Path(args.log)
    ours_url = f"http://127.0.0.1:{args.port}"
    base_url = f"http://127.0.0.1:{args.port + 1}"
    py = sys.executable
    ours_env = {**os.environ, "DATABASE_URL": ql, "REDIS_URL": redis_url, "PLANS_FILE": str(PLANS_FILE)}
    ours_env["WEBHOOK_ENVIRONMENT"] = "any"  # serve refuses to start without one; no webhook is sent here
    ours_env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # serve makes its own
    base_env = {**os.environ, "DATABASE_URL": bl}
    ours_cmd = [py, "-m", "service.cli", "serve", "--bind", ours_url[7:], "--workers", str(args.workers)]
    summary = []
    for phase in args.phases:
        hot = phase == "hot"
        module = "app_hot:app" if hot else "app:app"
        base_cmd = [py, "-m", "gunicorn", "-w", str(args.workers), "-b", base_url[7:], module]
        ours_req = ("/v1/accounts/{id}/takes", 1 if hot else ACCOUNTS)
        base_req = ("/take_hot" if hot else "/take", 1 if hot else ACCOUNTS)
        with ExitStack() as stack:
            ours_pid = stack.enter_context(server(ours_cmd, cwd=ROOT, env=ours_env, log=log)).pid
            base_pid = stack.enter_context(server(base_cmd, cwd=BASELINE, env=base_env, log=log)).pid
            wait_ready(ours_url, "/v1/accounts/acct-1/takes", key)
            wait_ready(base_url, base_req[0], key)
            warm = [a for a in wrk_args if not a.startswith("-d")] + ["-d3s"]
            run_wrk(ours_url, warm, *ours_req, key)  # every worker connected, queries prepared
            run_wrk(base_url, warm, *base_req, key)
            runs: list[tuple[WrkResult, WrkResult]] = []
            for rep in range(args.reps):
                sides = ["baseline", "ours"] if rep % 2 == 0 else ["ours", "baseline"]
                got = {}
                for side in sides:
                    if side == "ours":
                        got[side] = measured(ours_url, ql, ours_pid, wrk_args, *ours_req, key)
                    else:
                        got[side] = measured(base_url, bl, base_pid, wrk_args, *base_req, key)
                runs.append((got["baseline"], got["ours"]))
                print(
                    f"{phase} rep {rep + 1}: ours {got['ours']}; baseline {got['baseline']}; "
                    f"ratio {got['ours'].rps / got['baseline'].rps:.2f}",
                    flush=True,
                )
        ratios = [o.rps / b.rps for b, o in runs]
        cpu = [(o.app_us + o.db_us) / max(b.app_us + b.db_us, 1) for b, o in runs]
        summary.append(
            f"{phase} ({args.wrk}, {args.workers} workers, {args.reps} reps): throughput ratio median "
            f"{statistics.median(ratios):.2f} (runs {', '.join(f'{r:.2f}' for r in ratios)})\n"
            f"  CPU per request, ours / baseline (app + db): median {statistics.median(cpu):.2f}\n"
            f"  ours:     {medians([o for _, o in runs])}\n"
            f"  baseline: {medians([b for b, _ in runs])}"
        )
    print("\n" + "\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
