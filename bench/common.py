"""Helpers shared by the benchmark scripts: scratch databases, a server process, wrk's output."""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg


def server_urls(ap: argparse.ArgumentParser) -> tuple[str, str]:
    """DATABASE_URL and REDIS_URL: the one way every benchmark is told its servers, as the service
    itself is. DATABASE_URL may name any database of the server: the scratch ones sit beside it."""
    pg = os.environ.get("DATABASE_URL")
    if not pg:
        ap.error("set DATABASE_URL (and REDIS_URL, default redis://127.0.0.1:6379/0)")
    return pg, os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


def with_database(url: str, name: str) -> str:
    """`url` pointing at database `name` on the same server."""
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


def recreate_database(pg: str, name: str) -> str:
    """Drop and create the scratch database `name`; returns its URL."""
    with psycopg.connect(pg, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return with_database(pg, name)


@contextmanager
def server(cmd: list[str], *, cwd: Path, env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[Any]]:
    """Run `cmd` (a gunicorn server) for the duration of the block, output appended to `log`."""
    with open(log, "ab") as out:
        p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield p
    finally:
        p.send_signal(signal.SIGTERM)  # gunicorn: graceful stop of the arbiter and its workers
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def wrk_ms(value: str) -> float:
    """A wrk duration ('812.00us', '3.21ms', '1.02s') in milliseconds."""
    m = re.fullmatch(r"([0-9.]+)(us|ms|s|m)", value)
    if not m:
        raise ValueError(value)
    return float(m.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[m.group(2)]


def wrk_seconds(wrk_args: list[str]) -> float:
    """The run length that wrk's -d option asks for (wrk's default: 10 s)."""
    for i, a in enumerate(wrk_args):
        v = a[2:] if a.startswith("-d") and len(a) > 2 else (wrk_args[i + 1] if a == "-d" else None)
        if v:
            m = re.fullmatch(r"([0-9.]+)([smh]?)", v)
            if m:
                return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]
    return 10.0
