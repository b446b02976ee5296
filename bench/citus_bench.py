"""Take throughput on a local Citus cluster (coordinator + 2 workers) against one PostgreSQL, on the
same machine, in the same run: what the coordinator's routing costs a take.

    bench/run citus [--reps 5] [--seconds 10] [--keep]

One PostgreSQL: `bench_ql` on the server named by --pg (default: $DATABASE_URL). The cluster: started
by tests/citus/cluster.py in a temporary folder (Citus must be installed; in CI here
../shared/citus/install), `bench_ql` created with the citus extension, so that migration 0012
distributes it. Both get our migrations and 100,000 accounts; each repetition runs take() from the
same threads on each side, alternating which goes first, spread over the accounts and then on one
hot account. Prints every run, then the medians and the median ratio (cluster / one PostgreSQL).

--keep leaves the cluster running with `bench_ql` and the baseline's `bench_bl` on its coordinator,
and prints the URL and the command for the HTTP take bench against it (bench/http_bench.py
--no-setup); `python -m tests.citus.cluster stop --dir DIR` stops it afterwards.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from server_cpu import postmaster_pid, server_cpu  # noqa: E402
from take_bench import baseline_database, run_takes, seed_service_database, service_database  # noqa: E402

from tests.citus import cluster as citus  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pg", default=os.environ.get("DATABASE_URL"), help="the one PostgreSQL's URL")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--procs", type=int, default=2, help="processes the threads run in")
    ap.add_argument("--no-hot", action="store_true", help="skip the hot-account variant")
    ap.add_argument("--keep", action="store_true", help="leave the cluster up for the HTTP bench")
    ap.add_argument("--db", default="bench_ql", help="scratch database on --pg (the cluster uses bench_ql)")
    args = ap.parse_args(argv)
    if not args.pg:
        ap.error("give --pg URL or set DATABASE_URL")
    reason = citus.unavailable_reason()
    if reason:
        ap.error(f"no local Citus cluster here: {reason}")

    print("setting up bench_ql on one PostgreSQL and on a local Citus cluster ...", flush=True)
    plain = service_database(args.pg, args.db)
    cluster = citus.start()
    try:
        cluster.drop_database("bench_ql")
        sharded = seed_service_database(cluster.create_database("bench_ql"))
        # Server CPU per take on each node (bench/server_cpu.py): what the coordinator's routing costs
        # against what a worker's shard costs, the figures "What a node adds" reasons from.
        nodes = {
            "one": {"one PostgreSQL": postmaster_pid(args.pg)},
            "cluster": {
                ("coordinator" if i == 0 else f"worker {i}"): postmaster_pid(cluster.node_url(port))
                for i, port in enumerate(cluster.ports)
            },
        }
        cpu: dict[tuple[str, str, str], list[float]] = {}
        summary = []
        for name, hot in [("spread", False)] + ([] if args.no_hot else [("hot", True)]):
            ratios, ones, many = [], [], []
            for rep in range(args.reps):
                sides = [("one", plain), ("cluster", sharded)]
                got = {}
                for side, url in sides if rep % 2 == 0 else sides[::-1]:
                    servers = nodes[side]
                    before = [server_cpu(pid) for pid in servers.values()]
                    got[side] = run_takes(
                        url, threads=args.threads, procs=args.procs, seconds=args.seconds, hot=hot
                    )[0]
                    time.sleep(0.3)  # the run's backends reaped: their CPU is in the postmaster's
                    spent = [server_cpu(pid) - b for pid, b in zip(servers.values(), before, strict=True)]
                    per_take = [1e6 * s / (got[side] * args.seconds) for s in spent]
                    for node, us in zip(servers, per_take, strict=True):
                        cpu.setdefault((name, side, node), []).append(us)
                ones.append(got["one"])
                many.append(got["cluster"])
                ratios.append(got["cluster"] / got["one"])
                print(
                    f"{name} rep {rep + 1}: one PostgreSQL {got['one']:,.0f}/s, "
                    f"cluster {got['cluster']:,.0f}/s, ratio {ratios[-1]:.2f}",
                    flush=True,
                )
            summary.append(
                f"{name}, {args.threads} threads in {args.procs} process(es): cluster / one PostgreSQL "
                f"median {statistics.median(ratios):.2f} (runs {', '.join(f'{r:.2f}' for r in ratios)}); "
                f"one PostgreSQL median {statistics.median(ones):,.0f}/s, "
                f"cluster median {statistics.median(many):,.0f}/s"
            )
            summary.append(
                f"{name}, server CPU per take (median us): "
                + ", ".join(
                    f"{node} {statistics.median(v):,.0f}" for (n, _, node), v in cpu.items() if n == name
                )
            )
        print("\n" + "\n".join(summary))
        if args.keep:
            baseline_database(cluster.url(), "bench_bl")
            print(
                f"\ncluster kept in {cluster.root}: {cluster.url()}\n"
                f"HTTP take ratio on it: DATABASE_URL={cluster.url()} bench/run http --no-setup\n"
                f"then: scripts/citus-cluster stop --dir {cluster.root}"
            )
    finally:
        if not args.keep:
            citus.destroy(cluster)
    return 0


if __name__ == "__main__":
    sys.exit(main())
