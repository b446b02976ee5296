"""`quota-ledger ledger verify` of this checkout against an earlier commit's, on the same ledger in the
same run, and `quota-ledger ledger checkpoint` (a verify that also signs every head).

    python bench/verify_ab.py [--rows 300000] [--reps 3] [--baseline REV]

Seeds `bench_verify` as bench/ledger_tools_bench.py seeds its ledger (10 chained takes on each of
ROWS/10 counters), unpacks REV's `service/` (git archive) into a scratch folder, then per repetition
runs the baseline's verify and this checkout's, in alternating order, each a fresh process: rows/s
and peak RSS. Prints medians and the ratio this/baseline. Drops the database at the end.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import ledger_tools_bench as ledger_bench  # noqa: E402
import psycopg  # noqa: E402
from common import server_urls  # noqa: E402
from take_bench import ROOT  # noqa: E402

DB = "bench_verify"


def unpack(rev: str, into: Path) -> Path:
    """REV's service package, unpacked into `into` (run from there, `python -m service.cli` is REV's)."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "service"], check=True, capture_output=True
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def run(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, int, str]:
    ledger_bench.ROOT = cwd  # timed() runs its command from ROOT
    return ledger_bench.timed(cmd, env)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=300_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--baseline", default="main", metavar="REV", help="the commit to compare with")
    args = ap.parse_args(argv)
    pg, _ = server_urls(ap)
    ledger_bench.DB = DB
    print(f"seeding {DB} with {args.rows:,} chained ledger rows ...", flush=True)
    db = ledger_bench.seed(pg, args.rows)
    env = {"PATH": "/usr/bin:/bin", "DATABASE_URL": db, "PYTHONDONTWRITEBYTECODE": "1"}
    py = sys.executable
    key = Path(tempfile.mkdtemp(prefix="bench-verify-")) / "key.pem"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(key)], check=True)
    rates: dict[str, list[float]] = {"baseline": [], "this": [], "checkpoint": []}
    rss: dict[str, list[int]] = {"baseline": [], "this": [], "checkpoint": []}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-verify-base-") as tmp:
            base = unpack(args.baseline, Path(tmp))
            verify = [py, "-m", "service.cli", "ledger", "verify"]
            for rep in range(args.reps):
                order = [("baseline", base), ("this", ROOT)]
                for name, cwd in order if rep % 2 == 0 else order[::-1]:
                    secs, peak, text = run(verify, cwd, env)
                    assert text.rstrip().endswith(": OK"), text[-300:]
                    rates[name].append(args.rows / secs)
                    rss[name].append(peak)
                    print(
                        f"rep {rep + 1} {name}: {args.rows / secs:,.0f} rows/s, peak RSS {peak} MB",
                        flush=True,
                    )
                cmd = [
                    py,
                    "-m",
                    "service.cli",
                    "ledger",
                    "checkpoint",
                    "--key",
                    str(key),
                    "--output",
                    str(key) + ".json",
                ]
                secs, peak, _ = run(cmd, ROOT, env)
                rates["checkpoint"].append(args.rows / secs)
                rss["checkpoint"].append(peak)
                print(
                    f"rep {rep + 1} checkpoint: {args.rows / secs:,.0f} rows/s, peak RSS {peak} MB",
                    flush=True,
                )
    finally:
        with psycopg.connect(pg, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
    med = statistics.median
    print(f"\n{args.rows:,} ledger rows, {args.reps} reps, medians (baseline {args.baseline}):")
    for name in rates:
        print(f"  {name}: {med(rates[name]):,.0f} rows/s, peak RSS {max(rss[name])} MB")
    paired = [t / b for t, b in zip(rates["this"], rates["baseline"], strict=True)]
    print(f"  this / baseline: {med(rates['this']) / med(rates['baseline']):.2f}x of the medians,")
    print(
        f"  {med(paired):.2f}x the median of each repetition's pair ({', '.join(f'{r:.2f}' for r in paired)})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
