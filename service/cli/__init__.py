"""The `quota-ledger` command: migrate, serve, run the jobs, manage keys, check the ledger.

Exit codes: 0 success; 1 a finding (a broken chain, a reconciliation mismatch, a checkpoint that
does not verify); 2 a usage or configuration error (a bad option, a missing setting, an unreadable
file, an unknown account, a database that does not exist or answer, a role that lacks a privilege).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from service.cli.progress import JobLog, Progress
from service.config import Settings
from service.errors import MetricKindChanged, PlanConfigError
from service.vocabulary import Role

if TYPE_CHECKING:
    from service.plans import PlanConfig
    from service.quota.reset import Cadence

Command = Callable[[argparse.Namespace], int]

# The exit codes are decided in main alone: a command returns 0 or 1 (a finding) and raises
# UsageError for a usage or configuration error, which main prints as one line and exits 2 for.
USAGE = 2  # argparse's own for a bad option


class UsageError(Exception):
    """A usage or configuration error: main prints its message as one line and exits 2."""


def _settings(*, serving: bool = False) -> Settings:
    try:
        return Settings.from_env(serving=serving)
    except RuntimeError as e:
        raise UsageError(str(e)) from None


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


def _migrate_url(settings: Settings) -> str:
    """DATABASE_URL with the CLI's connect timeout unless it names one: the migrations connect on
    their own (yoyo), and without it a server that accepts but never answers hangs `migrate`."""
    from psycopg.conninfo import conninfo_to_dict

    from service.db import CONNECT_TIMEOUT

    url = settings.database_url
    if "://" not in url or "connect_timeout" in conninfo_to_dict(url):
        return url
    return f"{url}{'&' if '?' in url else '?'}connect_timeout={CONNECT_TIMEOUT}"


def cmd_migrate(args: argparse.Namespace) -> int:
    from service.migrate import NoMigrations, migrate
    from service.roles import RELAY_GROUP, ensure_login_role

    settings = _settings()
    if args.login_role and args.login_role == args.relay_role:
        raise UsageError(
            "--login-role and --relay-role name one role: the relay's must be its own, the one that "
            "reads the signing secrets"
        )
    try:
        applied = migrate(_migrate_url(settings))
    except NoMigrations as e:
        raise UsageError(f"{e}; the install is broken, nothing was done") from None
    print(f"applied: {', '.join(applied)}" if applied else "database is up to date")
    if args.login_role:
        ensure_login_role(settings.database_url, args.login_role, os.environ.get("LOGIN_ROLE_PASSWORD"))
        print(f"login role {args.login_role}: a member of quota_app")
    if args.relay_role:
        password = os.environ.get("RELAY_ROLE_PASSWORD")
        ensure_login_role(settings.database_url, args.relay_role, password, group=RELAY_GROUP)
        print(f"login role {args.relay_role}: a member of {RELAY_GROUP} (for `quota-ledger relay`)")
    return 0


# The service's role only reads API keys (migrations/0016).
OWNER_ONLY = (
    "keys are created, rotated and revoked as the tables' owner: run this with the DATABASE_URL migrate uses"
)


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


DEFAULT_GRACE = "24h"
DURATION = "a whole number with s, m, h or d (30m, 24h, 7d), or 0"
_DURATION_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def _duration(text: str) -> timedelta:
    """A DURATION as a timedelta; anything else is a usage error."""
    number, unit = text[:-1], text[-1:]
    if text == "0":
        return timedelta(0)
    if unit not in _DURATION_UNITS or not (number.isascii() and number.isdigit()):
        raise UsageError(f"{text!r} is not a duration: {DURATION}")
    return timedelta(**{_DURATION_UNITS[unit]: int(number)})


def cmd_keys_rotate(args: argparse.Namespace) -> int:
    from service.keys import rotate_key

    grace = _duration(args.grace)
    with _connect(_settings()) as conn:
        try:
            rotation = rotate_key(conn, name=args.name, grace=grace, actor=_cli_actor())
        except psycopg.errors.InsufficientPrivilege:
            raise UsageError(OWNER_ONLY) from None
        except psycopg.errors.UniqueViolation:  # another rotation of the name committed meanwhile
            print(f"{args.name!r} was rotated by someone else meanwhile: see keys list", file=sys.stderr)
            return 1
    if rotation is None:
        raise UsageError(f"no live key named {args.name!r} (keys list shows them)")
    if grace:
        until = rotation.old_until.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        old = f"the old key stays valid until {until} ({args.grace})"
    else:
        old = "the old key is no longer valid (running servers stop accepting it within KEY_CACHE_SECONDS)"
    print(f"rotated {rotation.role} key {args.name!r}; {old}; the new key is shown only once:")
    print(rotation.key)
    return 0


def cmd_keys_list(args: argparse.Namespace) -> int:
    from service.keys import list_keys

    with _connect(_settings()) as conn:
        for k in list_keys(conn):
            revoked = f"\trevoked {k.revoked_at}" if k.revoked_at else ""
            ends = f"\t{'expired' if k.expired else 'expires'} {k.expires_at}" if k.expires_at else ""
            print(f"{k.name}\t{k.role}\tcreated {k.created_at}{ends}{revoked}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Production web server: granian, worker processes with app threads, one pool of DB connections
    per worker."""
    from service.serve import PortInUse, serve

    _settings(serving=True)  # fail early and clearly on a missing DATABASE_URL or WEBHOOK_ENVIRONMENT
    try:
        serve(bind=args.bind, workers=args.workers, threads=args.threads, access_log=args.access_log)
    except PortInUse as e:
        raise UsageError(str(e)) from None
    return 0


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
    from service.quota.reset import MONTHLY

    return _reset(args, MONTHLY, args.period)


def cmd_reset_day(args: argparse.Namespace) -> int:
    """The daily reset (the counters of daily consumables), as cmd_reset_month."""
    from service.quota.reset import DAILY

    return _reset(args, DAILY, args.day)


def _reset(args: argparse.Namespace, cadence: Cadence, period: str | None) -> int:
    from service.quota.reset import reset_month

    command = cadence.command
    _log_to_stderr(args.verbose)
    progress = Progress(command, unit="counters", allowed=not args.verbose)
    bridged = JobLog(progress).attached("service.quota.reset") if progress.on else contextlib.nullcontext()
    with _connect(_settings()) as conn, progress, bridged:
        try:
            outcome = reset_month(
                conn,
                period=period,
                batch_size=args.batch_size,
                pause=args.pause,
                duty=args.duty,
                min_rate=args.min_rate,
                cadence=cadence,
            )
        except ValueError as e:
            print(f"quota-ledger {command}: {e}", file=sys.stderr)
            return 2
    print(outcome.message)
    return 0


def _job_plans(settings: Settings) -> PlanConfig:
    """The plan config for a job that writes by it; a broken file refuses the job before it starts
    (exit 2), so that nothing is changed by half a config."""
    from service.plans import load_plans

    try:
        return load_plans(settings.plans_file)
    except PlanConfigError as e:
        raise UsageError(f"refused, nothing changed: {e}") from None


def cmd_sync_plans(args: argparse.Namespace) -> int:
    """Plan sync, the same code as the Celery task; --dry-run prints the diff and writes nothing."""
    from service.quota.plan_sync import LimitChange, sync_plans

    _log_to_stderr(args.verbose)
    settings = _settings()
    plans = _job_plans(settings)

    progress = Progress("sync-plans", unit="accounts", allowed=not args.verbose)
    bridged = (
        JobLog(progress).attached("service.quota.plan_sync") if progress.on else contextlib.nullcontext()
    )

    def show(change: LimitChange) -> None:
        progress.clear()  # the changes may go to the same terminal
        print(change.describe(), flush=True)

    with _connect(settings) as conn, progress, bridged:
        progress.total = _rows_estimate(conn, "accounts")
        try:
            outcome = sync_plans(
                conn,
                plans,
                dry_run=args.dry_run,
                batch_size=args.batch_size,
                on_change=show,
                on_progress=progress.update,
            )
        except MetricKindChanged as e:
            raise UsageError(f"refused, nothing changed: {e}") from None
    print(outcome.message)
    return 0


def cmd_convert_metric(args: argparse.Namespace) -> int:
    """Convert the counters of a metric whose kind or reset changed in the plan config."""
    from service.quota import kinds

    settings = _settings()
    plans = _job_plans(settings)
    if args.metric not in plans.metrics:
        raise UsageError(f"unknown metric {args.metric!r}; known: {', '.join(plans.metrics)}")
    progress = Progress("convert-metric", unit="counters")
    with _connect(settings) as conn, progress:
        done = kinds.convert(conn, plans, metric=args.metric, on_progress=progress.update)
    kind = plans.metric(args.metric)
    now = kind.kind if kind.reset is None else f"{kind.kind}, reset every {kind.reset}"
    print(
        f"convert-metric {args.metric}: {done} counters now counted as {now}; what they held is "
        "in the ledger, cleared by their period-open reset rows"
    )
    return 0


EXPORT_PROGRESS_EVERY = 1000  # rows between the export's progress updates (each redraw is throttled)


def _rows_estimate(conn: psycopg.Connection[Any], table: str) -> int | None:
    """The planner's row count of `table`, for a progress ETA without counting (None: unknown, as
    on a Citus coordinator, whose table holds no rows itself, or before the first ANALYZE)."""
    row = conn.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass", (table,)).fetchone()
    return row[0] if row and row[0] > 0 else None


def _checkpoint_key(path: str | None, settings: Settings) -> Path:
    """--key FILE, else LEDGER_CHECKPOINT_KEY; neither is bad usage (exit 2)."""
    key = Path(path) if path else settings.ledger_checkpoint_key
    if key is None:
        raise UsageError("no key: --key FILE or LEDGER_CHECKPOINT_KEY")
    return key


def _account_exists(conn: psycopg.Connection[Any], account_id: str) -> bool:
    # ::text: a name the account id's domain refuses is simply not found
    return conn.execute("SELECT 1 FROM accounts WHERE id = %s::text", (account_id,)).fetchone() is not None


def cmd_ledger_verify(args: argparse.Namespace) -> int:
    """Walk every counter's hash chain, printing every break as it is found; with --checkpoint, also
    prove the checkpoint and that the ledger still extends it. Exit 0 when all holds, 1 on a finding
    or a refused checkpoint."""
    from service.quota import chain

    settings = _settings()
    pinned = None
    if args.checkpoint:
        from service.quota import checkpoint  # cryptography, loaded only for a checkpoint

        if args.since:
            print(
                "quota-ledger ledger verify: --checkpoint walks the whole ledger, not --since",
                file=sys.stderr,
            )
            return 2
        try:
            if args.public_key:
                key = checkpoint.load_public_key(Path(args.public_key))
            else:
                key = checkpoint.load_private_key(_checkpoint_key(args.key, settings)).public_key()
            text = Path(args.checkpoint).read_text(encoding="utf-8")
        except (checkpoint.KeyFileError, OSError) as e:
            print(f"quota-ledger ledger verify: {e}", file=sys.stderr)
            return 2
        try:
            pinned = checkpoint.read(text, key)
        except checkpoint.CheckpointRefused as e:
            print(f"ledger verify: checkpoint {args.checkpoint} refused: {e}")
            return 1
        print(
            f"checkpoint {pinned.created_at} (key {pinned.key_id}): {len(pinned.counters):,} counters, "
            f"signature and digest OK"
        )

    started = time.monotonic()
    with _connect(settings) as conn, Progress("ledger verify") as progress:
        if not args.account and not args.since:
            progress.total = _rows_estimate(conn, "ledger")

        def show(finding: chain.Finding) -> None:
            progress.clear()
            print(finding.describe(), flush=True)

        if pinned is not None:
            result = checkpoint.verify_against(  # checkpoint: imported above with --checkpoint
                conn, pinned, account_id=args.account, on_progress=progress.update, on_finding=show
            )
        else:
            result = chain.verify(
                conn, account_id=args.account, since=args.since, on_progress=progress.update, on_finding=show
            )
        if args.account and not result.rows and not _account_exists(conn, args.account):
            raise UsageError(f"no account {args.account!r}: it has no account row and no ledger rows")
    elapsed = time.monotonic() - started
    verdict = "OK" if result.ok else f"{result.breaks} break(s) in {result.broken_accounts} account(s)"
    extends = " (extends the checkpoint)" if pinned is not None and result.ok else ""
    print(
        f"ledger verify: {result.rows:,} rows checked in {result.counters:,} counters of "
        f"{result.accounts:,} accounts, {elapsed:.1f} s ({result.rows / max(elapsed, 1e-9):,.0f} rows/s): "
        f"{verdict}{extends}"
    )
    return 0 if result.ok else 1


def cmd_ledger_checkpoint(args: argparse.Namespace) -> int:
    """Sign the heads of every counter, after a whole verify; exit 1 (nothing written) if it fails."""
    from service.quota import checkpoint

    settings = _settings()
    try:
        key = checkpoint.load_private_key(_checkpoint_key(args.key, settings))
    except checkpoint.KeyFileError as e:
        print(f"quota-ledger ledger checkpoint: {e}", file=sys.stderr)
        return 2
    try:
        with _connect(settings) as conn, Progress("ledger checkpoint") as progress:
            progress.total = _rows_estimate(conn, "ledger")
            report = progress.update
            if args.output:
                written = checkpoint.write_file(conn, key, Path(args.output), on_progress=report)
            else:
                with tempfile.TemporaryFile("w+", encoding="utf-8") as out:  # stdout only once whole
                    written = checkpoint.write(conn, key, out, on_progress=report)
                    out.seek(0)
                    progress.clear()  # the checkpoint may go to the same terminal
                    shutil.copyfileobj(out, sys.stdout)
    except checkpoint.LedgerBroken as e:
        for finding in e.result.findings:
            print(finding.describe(), file=sys.stderr)
        print(f"ledger checkpoint: not signed: the ledger does not verify ({e})", file=sys.stderr)
        return 1
    print(written.message, file=sys.stderr)
    return 0


def cmd_ledger_export(args: argparse.Namespace) -> int:
    """A period's ledger, streamed: the CSV of GET /v1/ledger.csv, or the same records as JSON lines."""
    from service.quota import export, ledger

    chunks = export.csv_chunks if args.format == "csv" else export.jsonl_chunks
    rows = 0

    def counted(entries: Iterator[ledger.LedgerEntry]) -> Iterator[ledger.LedgerEntry]:
        nonlocal rows
        with Progress("ledger export", allowed=bool(args.output) or not sys.stdout.isatty()) as progress:
            for e in entries:
                rows += 1
                if rows % EXPORT_PROGRESS_EVERY == 0:
                    progress.update(rows)
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
    for g in result.grant_mismatches:
        print(
            f"{g.account_id} {g.metric} grant {g.grant_id}: remaining {g.remaining}, "
            f"ledger {g.ledger_remaining}"
        )
    bad = len(result.mismatches) + len(result.grant_mismatches)
    verdict = "OK" if result.ok else f"{bad} mismatch(es)"
    print(
        f"reconcile {result.period}: {result.checked:,} counters and {result.grants_checked:,} grants "
        f"checked: {verdict}"
    )
    return 0 if result.ok else 1


def cmd_expire_access(args: argparse.Namespace) -> int:
    """End the access that ended by time, the same code as the hourly Celery task."""
    from service.billing.expiry import end_expired

    _log_to_stderr(args.verbose)
    settings = _settings()
    plans = _job_plans(settings)
    with _connect(settings) as conn:
        print(end_expired(conn, plans).message)
    return 0


def cmd_inbox_stats(args: argparse.Namespace) -> int:
    """What the webhook inbox keeps, per provider and status, and what its retention removed."""
    from service.billing import inbox

    settings = _settings()
    with _connect(settings) as conn:
        kept, removed = inbox.stats(conn)
    r = inbox.Retention.of(settings)
    applied = f"{r.applied_days} days" if r.applied_days else "for ever"
    print(
        f"retention: applied {applied}, ignored {r.ignored_days} days, failed until replayed, "
        f"unmatched at most {r.unmatched_limit:,} per provider"
    )
    print(f"{'provider':<11} {'status':<10} {'events':>10} {'payload MB':>10}  oldest")
    for k in kept:
        print(
            f"{k.provider:<11} {k.status:<10} {k.events:>10,} {k.payload_bytes / 1e6:>10.1f}  "
            f"{k.oldest.isoformat(timespec='seconds')}"
        )
    for g in removed:
        print(
            f"removed: {g.provider} {g.status} ({g.reason}): {g.events:,}, the latest "
            f"{g.last_at.isoformat(timespec='seconds')} (e.g. {g.last_event_id})"
        )
    return 0


def cmd_inbox_purge(args: argparse.Namespace) -> int:
    """Remove what the inbox's retention no longer keeps, the same code as the hourly task."""
    from datetime import datetime

    from service import webhooks
    from service.billing import inbox

    _log_to_stderr(args.verbose)
    settings = _settings()
    with _connect(settings) as conn:
        outcome = inbox.purge(
            conn, inbox.Retention.of(settings), providers=webhooks.PROVIDERS, at=datetime.now(UTC)
        )
    print(outcome.message)
    return 0


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default, unless it has none (None, or off for a flag); fills each paragraph
    of a description or epilog on its own and keeps an indented table as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for para in text.strip().split("\n\n"):
            lines = para.splitlines()
            if any(line.startswith(" ") for line in lines[1:]):
                paragraphs.append("\n".join(indent + line for line in lines))
            else:
                paragraphs.append(super()._fill_text(para, width, indent))
        return "\n\n".join(paragraphs)

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or action.default is False or action.default is argparse.SUPPRESS:
            return action.help or ""
        return super()._get_help_string(action) or ""


_DB = "DATABASE_URL"
# The environment each command reads, shown in its --help (the settings: docs/operations.md); a
# subcommand not named has its command's.
ENVIRONMENT: dict[str, tuple[str, ...]] = {
    "migrate": (_DB, "LOGIN_ROLE_PASSWORD"),
    "keys": (_DB,),
    "serve": (_DB, "REDIS_URL", "WEBHOOK_ENVIRONMENT", "PLANS_FILE"),
    "dev": ("DATABASE_URL and REDIS_URL (else embedded servers)", "PLANS_FILE", "QUOTA_DEV_DIR"),
    "webhooks": ("STRIPE_WEBHOOK_SECRETS", "REVENUECAT_WEBHOOK_AUTH"),
    "worker": (_DB, "REDIS_URL", "PLANS_FILE"),
    "beat": ("REDIS_URL",),
    "ledger": (_DB,),
    "ledger verify": (_DB, "LEDGER_CHECKPOINT_KEY (--checkpoint without a key option)"),
    "ledger checkpoint": (_DB, "LEDGER_CHECKPOINT_KEY (without --key)"),
    "reconcile": (_DB,),
    "reset-month": (_DB, "PLANS_FILE"),
    "reset-day": (_DB, "PLANS_FILE"),
    "sync-plans": (_DB, "PLANS_FILE"),
    "convert-metric": (_DB, "PLANS_FILE"),
    "expire-access": (_DB, "PLANS_FILE"),
    "inbox": (_DB,),
    "relay": (_DB, "WEBHOOK_OUT_ALLOW_PRIVATE", "WEBHOOK_OUT_RETRY_SCHEDULE", "WEBHOOK_OUT_RETENTION_DAYS"),
}


def _finish(parser: argparse.ArgumentParser, environment: dict[str, tuple[str, ...]], top: str = "") -> None:
    """Give every subcommand the formatter, its one-line help as description, and its environment."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {a.dest: a.help for a in action._choices_actions}
        for name, child in action.choices.items():
            child.formatter_class = _Formatter
            line = helps.get(name)
            if child.description is None and line:
                child.description = f"{line[0].upper()}{line[1:]}."
            path = f"{top} {name}" if top else name
            needs = environment.get(path) or environment.get(top or name)
            if needs and child.epilog is None:
                child.epilog = "environment: " + ", ".join(needs)
            _finish(child, environment, path)


def build_parser() -> argparse.ArgumentParser:
    from importlib.metadata import version

    parser = argparse.ArgumentParser(
        prog="quota-ledger",
        description=__doc__,
        epilog="Every command reads its settings from the environment: docs/operations.md lists them.",
        formatter_class=_Formatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version('quota-ledger')}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    migrate = sub.add_parser("migrate", help="apply pending database migrations (as the tables' owner)")
    migrate.add_argument(
        "--login-role",
        metavar="NAME",
        help="then create (or update) the login role NAME that the service runs as, a member of "
        "quota_app, with the password in LOGIN_ROLE_PASSWORD if set",
    )
    migrate.add_argument(
        "--relay-role",
        metavar="NAME",
        help="then create (or update) the login role NAME that `relay` runs as, a member of "
        "quota_relay (the one role that reads the endpoints' signing secrets), with the password "
        "in RELAY_ROLE_PASSWORD if set",
    )
    migrate.set_defaults(func=cmd_migrate)

    keys = sub.add_parser(
        "keys", help="manage API keys (create, rotate and revoke as the tables' owner, as migrate runs)"
    ).add_subparsers(dest="keys_command", required=True)
    create = keys.add_parser("create", help="create a key; its last line of output is the key alone")
    create.add_argument("--role", required=True, choices=list(Role))
    create.add_argument("--name", required=True)
    create.set_defaults(func=cmd_keys_create)
    rotate = keys.add_parser(
        "rotate",
        help="issue a new key for the live key NAME (same role) and keep the old one valid for the "
        "grace, so a service rolls its key without a gap; its last line of output is the new key alone",
    )
    rotate.add_argument("name", metavar="NAME")
    rotate.add_argument(
        "--grace",
        default=DEFAULT_GRACE,
        metavar="DURATION",
        help=f"how long the old key stays valid: {DURATION} for not at all",
    )
    rotate.set_defaults(func=cmd_keys_rotate)
    revoke = keys.add_parser(
        "revoke", help="revoke a key by name (and the key it replaced, if that is still in its grace)"
    )
    revoke.add_argument("name")
    revoke.set_defaults(func=cmd_keys_revoke)
    keys.add_parser(
        "list", help="list keys (names, roles, and when rotated keys expire; never secrets)"
    ).set_defaults(func=cmd_keys_list)

    from service.serve import DEFAULT_THREADS

    serve = sub.add_parser("serve", help="run the web server (granian)")
    serve.add_argument("--bind", default="127.0.0.1:8000", metavar="HOST:PORT", help="where to listen")
    serve.add_argument("--workers", type=int, default=4, help="worker processes")
    serve.add_argument("--threads", type=int, default=DEFAULT_THREADS, help="app threads per worker")
    serve.add_argument("--access-log", action="store_true", help="log every request")
    serve.set_defaults(func=cmd_serve)

    from service.cli import dev, relay, webhooks

    dev.add_parser(sub)
    webhooks.add_parser(sub)
    relay.add_parser(sub)

    worker = sub.add_parser("worker", help="run a Celery worker (reset, catch-up, plan sync)")
    worker.add_argument("--concurrency", type=int, default=0, help="processes; 0: one per CPU")
    worker.add_argument(
        "--pool", default="prefork", choices=["prefork", "solo", "threads"], help="Celery's pool"
    )
    worker.add_argument("--hostname", default="quota-ledger@%h", help="Celery node name")
    worker.add_argument("--loglevel", default="INFO", help="Celery's log level")
    worker.set_defaults(func=cmd_worker)

    beat = sub.add_parser("beat", help="run the Celery beat scheduler (exactly one per deployment)")
    beat.add_argument("--schedule", default="celerybeat-schedule", metavar="FILE", help="beat state file")
    beat.add_argument("--loglevel", default="INFO", help="Celery's log level")
    beat.set_defaults(func=cmd_beat)

    from service.quota.periods import LEDGER_PERIOD_RE, is_day, is_period

    def ledger_period_arg(s: str) -> str:
        if not LEDGER_PERIOD_RE.fullmatch(s):
            raise argparse.ArgumentTypeError(
                f"{s!r} is not a month YYYY-MM (with its days), a day YYYY-MM-DD, or held (allocations)"
            )
        return s

    def period_arg(s: str) -> str:
        if not is_period(s):
            raise argparse.ArgumentTypeError(f"{s!r} is not a period YYYY-MM")
        return s

    ledger = sub.add_parser(
        "ledger", help="finance: verify the hash chain, checkpoint it, export a period"
    ).add_subparsers(dest="ledger_command", required=True)
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
    verify.add_argument(
        "--checkpoint",
        metavar="FILE",
        help="also prove this signed checkpoint and that the ledger still extends it "
        "(docs/ledger-checkpoints.md)",
    )
    verify.add_argument("--public-key", metavar="FILE", help="the checkpoint's Ed25519 public key (PEM)")
    verify.add_argument("--key", metavar="FILE", help="or its private key (default: LEDGER_CHECKPOINT_KEY)")
    verify.set_defaults(func=cmd_ledger_verify)
    checkpoint = ledger.add_parser(
        "checkpoint", help="verify, then sign every counter's head (Ed25519); exit 1 if the ledger is broken"
    )
    checkpoint.add_argument(
        "--key", metavar="FILE", help="Ed25519 private key, PEM (default: LEDGER_CHECKPOINT_KEY)"
    )
    checkpoint.add_argument("--output", metavar="FILE", help="default: standard output")
    checkpoint.set_defaults(func=cmd_ledger_checkpoint)
    exp = ledger.add_parser("export", help="a period's ledger, streamed (the columns of /v1/ledger.csv)")
    exp.add_argument("--period", type=ledger_period_arg, required=True, metavar="YYYY-MM")
    exp.add_argument("--format", choices=["csv", "jsonl"], default="csv", help="CSV or JSON lines")
    exp.add_argument("--output", metavar="FILE", help="default: standard output")
    exp.set_defaults(func=cmd_ledger_export)

    rec = sub.add_parser("reconcile", help="counters vs ledger for a period; exit 1 on a mismatch")
    rec.add_argument("--period", type=ledger_period_arg, required=True, metavar="YYYY-MM")
    rec.set_defaults(func=cmd_reconcile)

    def day_arg(s: str) -> str:
        if not is_day(s):
            raise argparse.ArgumentTypeError(f"{s!r} is not a day YYYY-MM-DD")
        return s

    from service.quota.reset import DEFAULT_BATCH_SIZE, DEFAULT_DUTY, DEFAULT_MIN_RATE

    month = sub.add_parser("reset-month", help="run the monthly reset now (a no-op once done)")
    month.add_argument("--period", type=period_arg, metavar="YYYY-MM", help="default: the current UTC month")
    month.set_defaults(func=cmd_reset_month)
    day = sub.add_parser("reset-day", help="run the daily reset (daily metrics) now (a no-op once done)")
    day.add_argument("--day", type=day_arg, metavar="YYYY-MM-DD", help="default: the current UTC day")
    day.set_defaults(func=cmd_reset_day)
    for reset in (month, day):
        reset.add_argument(
            "--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help="counters per transaction"
        )
        reset.add_argument("--pause", type=float, default=0.0, help="extra seconds to sleep between batches")
        reset.add_argument(
            "--duty", type=float, default=DEFAULT_DUTY, help="share of time spent in batches (1: no pacing)"
        )
        reset.add_argument(
            "--min-rate", type=float, default=DEFAULT_MIN_RATE, help="counters/s the pacing never goes below"
        )
        reset.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")

    conv = sub.add_parser(
        "convert-metric",
        help="count a metric's counters as the kind PLANS_FILE now gives it (clears what they hold)",
    )
    conv.add_argument("metric", help="a metric of PLANS_FILE whose kind or reset changed")
    conv.set_defaults(func=cmd_convert_metric)

    sync = sub.add_parser("sync-plans", help="bring stored plan limits in line with PLANS_FILE")
    sync.add_argument("--dry-run", action="store_true", help="print the changes, write nothing")
    sync.add_argument("--batch-size", type=int, default=1000, help="accounts per transaction")
    sync.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sync.set_defaults(func=cmd_sync_plans)

    expire = sub.add_parser("expire-access", help="end subscriptions whose access ended by time")
    expire.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    expire.set_defaults(func=cmd_expire_access)

    box = sub.add_parser("inbox", help="the webhook inbox's retention").add_subparsers(
        dest="inbox_command", required=True
    )
    box.add_parser("stats", help="what the inbox keeps and what its retention removed").set_defaults(
        func=cmd_inbox_stats
    )
    purge = box.add_parser("purge", help="remove what the retention no longer keeps (as the hourly task)")
    purge.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    purge.set_defaults(func=cmd_inbox_purge)
    _finish(parser, ENVIRONMENT)
    return parser


def _database_error(command: str, e: psycopg.Error) -> str:
    """The one line for a database error that is a setup mistake, not a bug; "" for any other."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    text = text.removeprefix("connection failed: ")
    if isinstance(e, psycopg.errors.InsufficientPrivilege):
        if command == "migrate":
            return "migrate must run as the tables' owner; see docs/operations.md"
        return f"{text}: DATABASE_URL's role lacks this privilege; see docs/operations.md"
    if isinstance(e, psycopg.OperationalError) and "does not exist" in text:
        return f"{text}: create it (createdb) or correct DATABASE_URL"
    if isinstance(e, psycopg.OperationalError) and text.startswith("connection"):
        return f"{text}: is PostgreSQL running, and DATABASE_URL right?"
    return ""


def _command_name(args: argparse.Namespace) -> str:
    sub = next((v for k, v in vars(args).items() if k.endswith("_command") and v), None)
    return f"{args.command} {sub}" if sub else str(args.command)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func: Command = args.func
    command = _command_name(args)
    try:
        return func(args)
    except (UsageError, PlanConfigError) as e:
        print(f"quota-ledger {command}: {e}", file=sys.stderr)
        return USAGE
    except OSError as e:
        if e.filename is None:  # not a file's: a bug or the machine's, with its traceback
            raise
        print(f"quota-ledger {command}: {e.filename}: {e.strerror}", file=sys.stderr)
        return USAGE
    except psycopg.Error as e:
        line = _database_error(args.command, e)
        if not line:
            raise
        print(f"quota-ledger {command}: {line}", file=sys.stderr)
        return USAGE
