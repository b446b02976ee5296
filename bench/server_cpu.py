"""CPU time a PostgreSQL server spent, read from /proc: its postmaster's own, its live children's
(backends, background workers) and the children it has reaped (cutime/cstime), so a backend that
exits during a run still counts. Linux only; the benchmarks run on the server's machine.

    pid = postmaster_pid(url)
    before = server_cpu(pid); ...run...; spent = server_cpu(pid) - before   # seconds

The server is found from its URL: `SHOW data_directory` (a superuser's connection) and the
postmaster's pid on the first line of postmaster.pid there.
"""

from __future__ import annotations

import os
from pathlib import Path

import psycopg

_TICK = os.sysconf("SC_CLK_TCK")


def postmaster_pid(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SHOW data_directory").fetchone()
    assert row is not None
    return int((Path(row[0]) / "postmaster.pid").read_text().split("\n", 1)[0])


def _stat(pid: int) -> list[str]:
    # Fields after the command name, which is in parentheses and may hold spaces.
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2 :].split()


def server_cpu(pid: int) -> float:
    """CPU seconds (user + system) of the server whose postmaster is `pid`, so far."""
    fields = _stat(pid)
    # After the name: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14).
    ticks = sum(int(f) for f in fields[11:15])
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == pid:
            continue
        try:
            child = _stat(int(entry.name))
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited meanwhile: now in the postmaster's cutime
        if int(child[1]) == pid:
            ticks += int(child[11]) + int(child[12])
    return ticks / _TICK
