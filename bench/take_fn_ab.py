"""The take statement against take functions (the service's take_delegated, migrations/repeatable/
take_delegated.sql, and the candidates of bench/take_fn_candidates.sql): the database side's CPU per
take, side by side, alternating, in the same run, on the same PostgreSQL.

    python bench/take_fn_ab.py [--db bench_fn_ab] [--reps 8] [--takes 5000] [--sides statement,...]
    python bench/take_fn_ab.py --cluster [--reps 4] [--seconds 6]     # throughput, one PostgreSQL vs Citus

Sets up the scratch database `--db` on the server named by DATABASE_URL (our migrations, 100,000
accounts, as bench/take_bench.py does) and creates the candidate functions there. Each repetition
runs `--takes` takes of every side, each on a random account, from one connection per side with
prepared statements, the sides taking turns of `--chunk` takes (the order rotating), and reads each
connection's server process CPU time (/proc/<pid>/stat, so the server must run on this machine)
before and after. CPU time, not throughput: on a shared machine a side's wall time moves with
everyone else's load, its own CPU per take much less, and the turns spread what load does to it
over every side. Prints every run, then per side the median CPU per take and the median of the
per-repetition ratios to the first side, and the load average at the start and the end.

Sides: `statement` (the service's take, service/quota/takes.sql), `before` (the take statement as
it was before the writers became functions, bench/take_before.sql), any function of the
candidates file or the service by name; `<side>@unchecked` runs in a copy of --db with the schema
as it was before migrations 0016, 0021 and 0029 (SCHEMA_BEFORE).

--citus: the same turns on a local Citus cluster, CPU summed over its coordinator and workers.

--cluster: throughput instead, `pgbench -M prepared -c 8 -j 2` per side, on `--db` and on the same
database on a local Citus cluster (tests/citus/cluster.py, started in a temporary folder and
stopped after), where the candidate functions are distributed by account (co-located with quotas)
so that Citus delegates each call to the worker holding the account (take_delegated is distributed
by migrate). On the cluster the sides take disjoint accounts, so that one side's takes never wait
on another's row locks (ids no longer matter: the chain is ordered by seq, migrations/0015). Prints
per side and server the median takes/s and the median ratio to the statement on one PostgreSQL.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import psycopg  # noqa: E402
from common import server_urls, with_database  # noqa: E402
from server_cpu import postmaster_pid, server_cpu  # noqa: E402
from take_bench import (  # noqa: E402
    ACCOUNTS,
    METRIC,
    account_name,
    our_take_script,
    run_pgbench,
    seed_service_database,
    service_database,
)

from service.db import Q  # noqa: E402
from service.quota import periods  # noqa: E402

CANDIDATES = HERE / "take_fn_candidates.sql"
WRITERS = HERE.parent / "migrations" / "repeatable" / "ledger_writers.sql"
BEFORE = HERE / "take_before.sql"
# A side named `<side>@unchecked` runs in a copy of --db with the schema of the take as it was before
# the writers became functions (main at 16a72a0): without migration 0016's CHECK on the ledger,
# with 0021's domains and trigger back to the table CHECKs of 0001, and 0029's limit trigger back to
# 0001's generated columns (re-added, so at the end of the row). `before@unchecked` is that take.
UNCHECKED = "@unchecked"
SCHEMA_BEFORE = """
ALTER TABLE ledger DROP CONSTRAINT IF EXISTS ledger_row_check, DROP CONSTRAINT IF EXISTS ledger_links_check,
    ALTER COLUMN kind TYPE text, ALTER COLUMN units TYPE bigint, ALTER COLUMN used_after TYPE bigint,
    ALTER COLUMN account_id TYPE text, ALTER COLUMN prev_hash TYPE bytea, ALTER COLUMN hash TYPE bytea;
ALTER TABLE ledger
    ADD CONSTRAINT ledger_kind_check CHECK (kind IN ('take', 'release', 'reset')),
    ADD CONSTRAINT ledger_units_check CHECK (units >= 0),
    ADD CONSTRAINT ledger_used_after_check CHECK (used_after >= 0),
    ADD CONSTRAINT ledger_check CHECK ((kind = 'release') = (take_id IS NOT NULL));
DROP TRIGGER quotas_limit_rules ON quotas;
DROP TRIGGER IF EXISTS quotas_effective_limit ON quotas;
ALTER TABLE quotas DROP COLUMN lim, DROP COLUMN limit_source,
    ADD COLUMN lim bigint GENERATED ALWAYS AS (
        CASE WHEN override_set THEN override_limit WHEN lapsed THEN free_limit ELSE plan_limit END) STORED,
    ADD COLUMN limit_source text GENERATED ALWAYS AS (
        CASE WHEN override_set THEN 'override' WHEN lapsed THEN 'free_fallback' ELSE 'plan' END) STORED;
ALTER TABLE quotas
    ADD CONSTRAINT quotas_plan_limit_check CHECK (plan_limit >= 0),
    ADD CONSTRAINT quotas_free_limit_check CHECK (free_limit >= 0),
    ADD CONSTRAINT quotas_override_limit_check CHECK (override_limit >= 0),
    ADD CONSTRAINT quotas_check CHECK (override_set OR override_limit IS NULL);
"""
CLK_TCK = os.sysconf("SC_CLK_TCK")


def backend_cpu(pid: int) -> float:
    """User + system CPU seconds of server process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def statement(side: str) -> str:
    side = side.partition("@")[0]
    if side == "statement":
        return Q.take
    if side == "before":
        return BEFORE.read_text()
    return (
        f"SELECT * FROM {side}(%(account_id)s, %(metric)s, %(units)s, %(period)s, "
        "%(idempotency_key)s, %(actor)s)"
    )


def run_sides(
    urls: dict[str, str], sides: list[str], takes: int, seed: int, chunk: int, nodes: list[int] | None = None
) -> dict[str, float]:
    """CPU seconds per take of each side's server process after `takes` takes of every side, taken in
    turns of `chunk` takes (so that the machine's load, which moves, falls on every side alike), each
    side from its own connection; with `nodes` (postmaster pids, --citus), of those whole servers
    during the side's turns instead (bench/server_cpu.py)."""
    rnd = random.Random(seed)
    params = {
        "metric": METRIC,
        "units": 1,
        "period": periods.current_period(),
        "idempotency_key": None,
        "actor": "bench",
    }
    conns = {s: psycopg.connect(urls[s], autocommit=True, prepare_threshold=0) for s in sides}
    try:
        pids = {s: c.info.backend_pid for s, c in conns.items()}

        def spent(side: str) -> float:
            return sum(server_cpu(p) for p in nodes) if nodes else backend_cpu(pids[side])

        def turn(side: str, n: int) -> None:
            sql = statement(side)
            for _ in range(n):
                account = account_name(rnd.randint(1, ACCOUNTS))
                row = conns[side].execute(sql, {**params, "account_id": account}).fetchone()
                assert row is not None and row[0] is not None, row

        for side in sides:
            turn(side, 50)  # prepared and planned before the clock starts
        cpu = dict.fromkeys(sides, 0.0)
        start = {s: spent(s) for s in sides}
        for r in range(max(takes // chunk, 1)):
            for side in sides[r % len(sides) :] + sides[: r % len(sides)]:
                before = spent(side) if nodes else 0.0
                turn(side, chunk)
                if nodes:
                    cpu[side] += spent(side) - before
        if not nodes:  # each backend idles while the others take: its whole time is its turns'
            cpu = {s: spent(s) - start[s] for s in sides}
        return {s: cpu[s] / (max(takes // chunk, 1) * chunk) for s in sides}
    finally:
        for c in conns.values():
            c.close()


def writer_variants() -> str:
    """Variants of the service's ledger_take (docs/design/ledger-writers.md), made from its source:
    take_definer_noset without the fixed search_path (its tables and ledger_link named with their
    schema instead), take_invoker without SECURITY DEFINER, take_definer_into returning its row
    through OUT parameters instead of RETURN QUERY (a refused take: one row of NULLs)."""
    text = WRITERS.read_text()
    start = text.index("CREATE OR REPLACE FUNCTION ledger_take(")
    take = text[start : text.index("END\n$f$;", start) + len("END\n$f$;")]
    definer = " SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp"
    noset = (
        take.replace("ledger_take(", "take_definer_noset(", 1)
        .replace(" SET search_path = pg_catalog, public, pg_temp", "")
        .replace("UPDATE quotas q", "UPDATE public.quotas q")
        .replace("INSERT INTO ledger (", "INSERT INTO public.ledger (")
        .replace("ledger_link(", "public.ledger_link(")
    )
    invoker = take.replace("ledger_take(", "take_invoker(", 1).replace(definer, "")
    returns = re.search(r"\) RETURNS TABLE \((.*?)\)\n", take, re.S)
    assert returns is not None
    outs = ", ".join("OUT " + c.strip() for c in returns[1].split(","))
    into = (
        take.replace("ledger_take(", "take_definer_into(", 1)
        .replace(returns[0], f", {outs})\n")
        .replace("RETURN QUERY\n", "")
        .replace(
            "\n  FROM entry e;",
            '\n  INTO take_id, metric, units, used, "limit", period, limit_source\n  FROM entry e;',
        )
    )
    # Since events out (issue 26) ledger_take returns its row through SELECT ... INTO already: the
    # OUT-parameter variant is made only from a source that still returns it with RETURN QUERY.
    return "\n".join((noset, invoker, into) if "RETURN QUERY\n" in take else (noset, invoker))


def unchecked_copy(pg: str, db: str) -> str:
    """A copy of `db` with the schema of the take before 0016 (SCHEMA_BEFORE); returns its URL."""
    name = db + UNCHECKED.replace("@", "_")
    with psycopg.connect(pg, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{db}"')
    url = with_database(pg, name)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SCHEMA_BEFORE)  # a constant of ours, with no parameters
    return url


def pgbench_script(tmp: Path, side: str, first: int, last: int) -> Path:
    """`side` as a pgbench script taking on a random account among acct-<first>..acct-<last>."""
    if side == "statement":
        body = our_take_script(tmp, hot=False).read_text().split("\n", 1)[1]
    else:
        body = (
            f"SELECT * FROM {side}(('acct-' || :aid), '{METRIC}', 1, '{periods.current_period()}', "
            "NULL::text, 'bench');\n"
        )
    path = tmp / f"{side}_{first}_{last}.sql"
    path.write_text(f"\\set aid random({first}, {last})\n" + body)
    return path


def distribute_candidates(url: str, sides: list[str]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(CANDIDATES.read_text())
        conn.execute(writer_variants())
        for side in sides:
            if side not in ("statement", "take_delegated"):  # migrate distributed take_delegated
                conn.execute(
                    "SELECT create_distributed_function(%s, 'p_account_id', colocate_with := 'quotas')",
                    (f"{side}(text, text, bigint, text, text, text)",),
                )


def throughput(plain: str, sides: list[str], reps: int, seconds: float) -> None:
    """Takes/s of every side on one PostgreSQL and on a local Citus cluster, in the same run."""
    import tempfile

    from tests.citus import cluster as citus

    reason = citus.unavailable_reason()
    if reason:
        raise SystemExit(f"no local Citus cluster here: {reason}")
    tmp = Path(tempfile.mkdtemp(prefix="bench-take-fn-"))
    cluster = citus.start()
    try:
        sharded = seed_service_database(cluster.create_database("bench_fn_ab"))
        distribute_candidates(sharded, sides)
        share = ACCOUNTS // len(sides)
        runs = [("one", s, plain, pgbench_script(tmp, s, 1, ACCOUNTS)) for s in sides] + [
            ("cluster", s, sharded, pgbench_script(tmp, s, 1 + i * share, (i + 1) * share))
            for i, s in enumerate(sides)
        ]
        tps: dict[tuple[str, str], list[float]] = {(where, s): [] for where, s, _, _ in runs}
        ratios: dict[tuple[str, str], list[float]] = {key: [] for key in tps}
        load0 = os.getloadavg()
        for rep in range(reps):
            order = runs[rep % len(runs) :] + runs[: rep % len(runs)]
            got = {
                (where, s): run_pgbench(url, str(f), clients=8, seconds=seconds, mode="prepared")[0]
                for where, s, url, f in order
            }
            for key, value in got.items():
                tps[key].append(value)
                ratios[key].append(value / got[("one", "statement")])
            print(
                f"rep {rep + 1} (load {os.getloadavg()[0]:.1f}): "
                + ", ".join(f"{where} {s} {got[(where, s)]:,.0f}/s" for where, s, _, _ in runs),
                flush=True,
            )
        print(
            f"\ntakes/s, pgbench -M prepared -c 8, median of {reps} (load average {load0[0]:.1f} at start, "
            f"{os.getloadavg()[0]:.1f} at end); ratio: to the statement on one PostgreSQL, same repetition"
        )
        for key in tps:
            print(
                f"  {key[0]} {key[1]}: {statistics.median(tps[key]):,.0f}/s, ratio median "
                f"{statistics.median(ratios[key]):.2f} (runs {', '.join(f'{r:.2f}' for r in ratios[key])})"
            )
    finally:
        citus.destroy(cluster)


def on_citus(sides: list[str], reps: int, takes: int, chunk: int) -> int:
    """CPU per take as --sides alternate on a local Citus cluster (tests/citus/cluster.py), summed over
    its coordinator and workers: the delegated take runs on the account's worker."""
    from tests.citus import cluster as citus

    reason = citus.unavailable_reason()
    if reason:
        raise SystemExit(f"no local Citus cluster here: {reason}")
    cluster = citus.start()
    try:
        sharded = seed_service_database(cluster.create_database("bench_fn_ab"))
        distribute_candidates(sharded, sides)
        nodes = [postmaster_pid(cluster.node_url(port)) for port in cluster.ports]
        return cpu_per_take({s: sharded for s in sides}, sides, reps, takes, chunk, nodes)
    finally:
        citus.destroy(cluster)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", default="bench_fn_ab", help="scratch database (%(default)s)")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--takes", type=int, default=5000, help="takes per side per repetition")
    ap.add_argument("--chunk", type=int, default=100, help="takes per turn: the sides take turns")
    ap.add_argument("--sides", default="statement,take_delegated,take_fn_cte", help="the first is the base")
    ap.add_argument("--no-setup", action="store_true", help="reuse --db as it is")
    ap.add_argument("--cluster", action="store_true", help="throughput on one PostgreSQL and on Citus")
    ap.add_argument("--seconds", type=float, default=6, help="per pgbench run, with --cluster")
    ap.add_argument(
        "--citus", action="store_true", help="CPU per take of every node of a local Citus cluster"
    )
    args = ap.parse_args(argv)
    sides = args.sides.split(",")
    if args.citus:
        return on_citus(sides, args.reps, args.takes, args.chunk)
    pg, _ = server_urls(ap)
    url = with_database(pg, args.db) if args.no_setup else service_database(pg, args.db)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(CANDIDATES.read_text())  # a trusted file of ours, with no parameters
        conn.execute(writer_variants())
    # `<side>@<variant>`: in the database `<--db>_<variant>` (made by hand, except `unchecked`)
    urls = {s: with_database(pg, f"{args.db}_{s.partition('@')[2]}") if "@" in s else url for s in sides}
    if any(s.endswith(UNCHECKED) for s in sides):
        unchecked = with_database(pg, args.db + UNCHECKED.replace("@", "_"))
        if not args.no_setup:
            unchecked = unchecked_copy(pg, args.db)
        urls.update({s: unchecked for s in sides if s.endswith(UNCHECKED)})
    if args.cluster:
        throughput(url, sides, args.reps, args.seconds)
        return 0
    return cpu_per_take(urls, sides, args.reps, args.takes, args.chunk)


def cpu_per_take(
    urls: dict[str, str], sides: list[str], reps: int, takes: int, chunk: int, nodes: list[int] | None = None
) -> int:
    load0 = os.getloadavg()
    cpu: dict[str, list[float]] = {s: [] for s in sides}
    ratios: dict[str, list[float]] = {s: [] for s in sides[1:]}
    for rep in range(reps):
        got = run_sides(urls, sides, takes, seed=rep, chunk=chunk, nodes=nodes)
        for side in sides:
            cpu[side].append(got[side])
        for side in sides[1:]:
            ratios[side].append(got[side] / got[sides[0]])
        print(
            f"rep {rep + 1} (load {os.getloadavg()[0]:.1f}): "
            + ", ".join(f"{s} {got[s] * 1e6:.0f} us" for s in sides),
            flush=True,
        )
    print(
        f"\n{'servers' if nodes else 'server'} CPU per take, median of {reps} "
        f"(load average {load0[0]:.1f} at start, {os.getloadavg()[0]:.1f} at end):"
    )
    for side in sides:
        line = f"  {side}: {statistics.median(cpu[side]) * 1e6:.0f} us"
        if side in ratios:
            line += (
                f", / {sides[0]} median {statistics.median(ratios[side]):.3f}"
                f" (runs {', '.join(f'{r:.2f}' for r in ratios[side])})"
            )
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
