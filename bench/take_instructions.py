"""Instructions per take, counted: the sides of bench/take_fn_ab.py run in a single-user PostgreSQL
backend under valgrind's callgrind, so that a difference of one or two percent shows the same on a
busy machine as on a quiet one (CPU time from /proc moves by ±10% with the load of a shared machine).

    python bench/take_instructions.py [--db bench_wr_fn] [--takes 300] [--sides before@unchecked,statement]

Reads the databases that `bench/run take-fn` set up on the server named by DATABASE_URL (`--db`, and
`<--db>_unchecked` for `@unchecked` sides: run take-fn once first), copies them with pg_dump into a
private PostgreSQL in a temporary folder (initdb; as the user `postgres` when run as root), with
every limit lifted so that no take is refused, and stops it. Then, for each side, from the same copy
of that folder each time, counts the instructions of a backend (`postgres --single`, fsync off) that
prepares the side's statement, takes 12 times to settle its plan, and takes `--takes` more on accounts
no side touched; and again without the `--takes`; the difference over `--takes` is the figure. What
it counts is the backend's own work: no client, no socket, no wait for the disk. Needs valgrind.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import server_urls, with_database  # noqa: E402
from take_bench import METRIC, account_name  # noqa: E402
from take_fn_ab import UNCHECKED, statement  # noqa: E402

from service.quota import periods  # noqa: E402

PARAMS = ("account_id", "metric", "units", "period", "idempotency_key", "actor")
SETTLE = 12  # custom plans, then the generic one


def bindir() -> Path:
    return Path(
        subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True).stdout.strip()
    )


def as_owner(cmd: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: run its programs as `postgres` then."""
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


def prepared(side: str) -> str:
    """The side's statement as PREPARE t(...) with positional parameters."""
    sql = "\n".join(line for line in statement(side).splitlines() if not line.lstrip().startswith("--"))
    for n, name in enumerate(PARAMS, 1):
        sql = sql.replace(f"%({name})s", f"${n}")
    return f"PREPARE t(text, text, bigint, text, text, text) AS {sql.strip()}"


def script(side: str, takes: int, first: int) -> str:
    period = periods.current_period()
    run = [prepared(side)]
    accounts = [*range(first - SETTLE, first), *range(first, first + takes)]
    run += [f"EXECUTE t('{account_name(a)}', '{METRIC}', 1, '{period}', NULL, 'bench')" for a in accounts]
    return "".join(s + ";\n\n" for s in run)  # `postgres --single -j`: a statement ends at ;<empty line>


def count(data: Path, snapshot: Path, db: str, text: str) -> int:
    shutil.rmtree(data)
    subprocess.run(["cp", "-a", str(snapshot), str(data)], check=True)
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        str(bindir() / "postgres"),
        "--single",
        "-j",
        "-D",
        str(data),
        "-c",
        "fsync=off",
        "-c",
        "synchronous_commit=off",
        db,
    ]
    done = subprocess.run(as_owner(cmd), input=text, capture_output=True, text=True)
    got = re.search(r"Collected : (\d+)", done.stderr)
    if not got or "ERROR" in done.stdout + done.stderr:
        sys.exit(f"take_instructions: the backend failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return int(got[1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", default="bench_wr_fn", help="the database take-fn set up (%(default)s)")
    ap.add_argument("--takes", type=int, default=300, help="takes counted per side")
    ap.add_argument("--first", type=int, default=2000, help="the first account taken on")
    ap.add_argument("--sides", default="before@unchecked,statement,before", help="the first is the base")
    args = ap.parse_args(argv)
    if not shutil.which("valgrind"):
        sys.exit("take_instructions: needs valgrind (apt-get install valgrind)")
    pg, _ = server_urls(ap)
    sides = args.sides.split(",")
    dbs = {
        s: args.db + UNCHECKED.replace("@", "_")
        if s.endswith(UNCHECKED)
        else (f"{args.db}_{s.partition('@')[2]}" if "@" in s else args.db)
        for s in sides
    }
    tmp = Path(tempfile.mkdtemp(prefix="take-instructions-"))
    data, snapshot, sock = tmp / "data", tmp / "snapshot", tmp
    try:
        if os.geteuid() == 0:
            shutil.chown(tmp, "postgres")
        subprocess.run(
            as_owner([str(bindir() / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"]),
            check=True,
            capture_output=True,
        )
        ctl = [str(bindir() / "pg_ctl"), "-D", str(data), "-w"]
        subprocess.run(
            as_owner(
                [*ctl, "-o", f"-p 5499 -k {sock} -c listen_addresses=''", "-l", str(tmp / "log"), "start"]
            ),
            check=True,
            capture_output=True,
        )
        local = ["-h", str(sock), "-p", "5499", "-U", "postgres", "-q", "-v", "ON_ERROR_STOP=1"]
        roles = subprocess.run(
            ["pg_dumpall", "--roles-only", "-d", pg], capture_output=True, text=True, check=True
        )
        subprocess.run(
            ["psql", *local[:-2], "-d", "postgres"], input=roles.stdout, capture_output=True, text=True
        )
        for db in sorted(set(dbs.values())):
            print(f"copying {db} ...", file=sys.stderr, flush=True)
            subprocess.run(["psql", *local, "-d", "postgres", "-c", f'CREATE DATABASE "{db}"'], check=True)
            dump = subprocess.Popen(["pg_dump", "-d", with_database(pg, db)], stdout=subprocess.PIPE)
            # Not ON_ERROR_STOP: a dump re-creates what initdb made (schema public); anything else fails.
            done = subprocess.run(
                ["psql", *local[:-2], "-d", db], stdin=dump.stdout, capture_output=True, text=True
            )
            dump.wait()
            errors = [e for e in done.stderr.splitlines() if "ERROR" in e and "already exists" not in e]
            if errors:
                sys.exit(f"take_instructions: could not copy {db}: {errors[0]}")
            subprocess.run(
                [
                    "psql",
                    *local,
                    "-d",
                    db,
                    "-c",
                    "ALTER TABLE quotas DISABLE TRIGGER USER;"
                    " UPDATE quotas SET plan_limit = NULL, free_limit = NULL, override_set = false,"
                    " override_limit = NULL; ALTER TABLE quotas ENABLE TRIGGER USER",
                ],
                check=True,
            )
        subprocess.run(as_owner([*ctl, "stop"]), check=True, capture_output=True)
        subprocess.run(["cp", "-a", str(data), str(snapshot)], check=True)
        per_take = {}
        for side in sides:
            idle = count(data, snapshot, dbs[side], script(side, 0, args.first))
            busy = count(data, snapshot, dbs[side], script(side, args.takes, args.first))
            per_take[side] = (busy - idle) / args.takes
            ratio = per_take[side] / per_take[sides[0]]
            print(
                f"{side}: {per_take[side]:,.0f} instructions per take, {ratio:.3f} x {sides[0]}", flush=True
            )
    finally:
        subprocess.run(
            as_owner([str(bindir() / "pg_ctl"), "-D", str(data), "stop", "-m", "immediate"]),
            capture_output=True,
        )
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
