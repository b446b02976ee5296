"""Long commands show progress on a terminal and print nothing extra without one: `ledger verify`,
`ledger export` and `sync-plans` run with standard error on a pseudo-terminal, then on a pipe; the
monthly reset's log-driven progress line, drawn on a pseudo-terminal."""

from __future__ import annotations

import logging
import os
import pty
import subprocess
import sys
from typing import Any

from service.cli.progress import JobLog, Progress
from tests.conftest import PLANS_FILE
from tests.db.helpers import new_account
from tests.db.test_finance_commands import PERIOD, _workload

# Report every row, so that a small ledger shows progress (the thresholds are for real ledgers).
EVERY_ROW = (
    "import service.quota.chain as c, service.cli as cli; c.PROGRESS_EVERY = 1; cli.EXPORT_PROGRESS_EVERY = 1"
)


def run(
    db_url: str, *args: str, tty: bool, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[bytes], str]:
    """The command with standard error on a pseudo-terminal (tty) or a pipe; (process, stderr)."""
    code = f"import sys\n{EVERY_ROW}\nsys.exit(cli.main(sys.argv[1:]))"
    env = {**os.environ, **(env or {}), "DATABASE_URL": db_url}
    argv = [sys.executable, "-c", code, *args]
    if not tty:
        done = subprocess.run(argv, env=env, capture_output=True, timeout=120)
        return done, done.stderr.decode()
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=follower, timeout=120)
        os.close(follower)
        follower = -1
        seen = _drain(leader)
    finally:
        if follower != -1:
            os.close(follower)
    return done, seen.decode()


def _drain(leader: int) -> bytes:
    """All a pseudo-terminal's other (closed) end wrote; closes `leader`."""
    seen = b""
    try:
        while chunk := os.read(leader, 65536):
            seen += chunk
    except OSError:  # EIO: the other end is closed and all is read
        pass
    finally:
        os.close(leader)
    return seen


def test_verify_and_export_show_progress_on_a_terminal_only(conn: Any, db_url: str, plans: Any) -> None:
    _workload(conn, plans)  # 9 ledger rows
    verify = ("ledger", "verify")
    export = ("ledger", "export", "--period", PERIOD, "--output", os.devnull)
    for args in (verify, export):
        on_tty, err = run(db_url, *args, tty=True)
        assert on_tty.returncode == 0, err
        assert f"\r{args[0]} {args[1]}: " in err and " rows/s" in err, err
        assert err.endswith("\r\x1b[K") or "\r\x1b[K" in err  # erased before anything else prints
        in_log, log = run(db_url, *args, tty=False)
        assert in_log.returncode == 0, log
        assert "\r" not in log and "rows/s" not in log, log  # a log gets no progress
    assert run(db_url, *verify, tty=False)[1] == ""
    assert "ledger verify: 9 rows checked" in run(db_url, *verify, tty=False)[0].stdout.decode()
    assert run(db_url, *export, tty=False)[1].strip().splitlines() == [f"ledger export {PERIOD}: 9 rows"]


def test_sync_plans_shows_progress_on_a_terminal_only(conn: Any, db_url: str, plans: Any) -> None:
    for _ in range(5):
        new_account(conn, plans)
    conn.execute("ANALYZE accounts")  # the planner's estimate is the line's total
    env = {"PLANS_FILE": str(PLANS_FILE)}
    sync = ("sync-plans", "--batch-size", "2")
    on_tty, err = run(db_url, *sync, tty=True, env=env)
    assert on_tty.returncode == 0, err
    assert "\rsync-plans: 2 accounts, " in err and " accounts/s, 40% of ~5, ETA " in err, err
    assert "\r\x1b[K" in err  # erased before the outcome prints
    assert "plan sync: 5 accounts checked" in on_tty.stdout.decode()
    in_log, log = run(db_url, *sync, tty=False, env=env)
    assert in_log.returncode == 0 and log == "", log  # a log gets no progress
    assert "plan sync: 5 accounts checked" in in_log.stdout.decode()
    verbose, logged = run(db_url, *sync, "-v", tty=True, env=env)
    assert verbose.returncode == 0 and "\r" not in logged, logged  # -v logs instead


def test_the_reset_progress_line_follows_its_log() -> None:
    leader, follower = pty.openpty()
    with os.fdopen(follower, "w", closefd=True) as term:
        progress = Progress("reset-month", unit="counters", total=100, stream=term)
        assert progress.on
        with progress, JobLog(progress).attached("service.quota.reset"):
            log = logging.getLogger("service.quota.reset")
            log.info("monthly reset %s: %d counters reset so far", "2026-01", 25)
            log.warning("monthly reset %s: batch rolled back (%s); retrying", "2026-01", "Deadlock")
        term.flush()
    seen = _drain(leader).decode()
    assert "reset-month: 25 counters" in seen and "25% of ~100, ETA" in seen, seen
    assert "WARNING service.quota.reset: monthly reset 2026-01: batch rolled back" in seen, seen
    assert not logging.getLogger("service.quota.reset").handlers  # detached after the block


def test_no_progress_without_a_terminal() -> None:
    with open(os.devnull, "w") as log:
        assert not Progress("x", stream=log).on
