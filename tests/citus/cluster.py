"""A local Citus cluster for tests and benchmarks: a coordinator and two workers, each an ordinary
PostgreSQL 15 on its own free port, in a temporary folder, run as a non-root user.

    python -m tests.citus.cluster start [--dir DIR]   # prints the coordinator's URL
    python -m tests.citus.cluster url   [--dir DIR]
    python -m tests.citus.cluster stop  [--dir DIR]

(scripts/citus-cluster runs it with the project's .venv.) Citus itself comes from its own packages or,
in CI and development here, from ../shared/citus (its `install` script); `available()` says whether
this machine has it, so the tests that need a cluster skip with that reason when it does not.

Databases: Citus keeps its metadata (nodes, shards) per database, and a worker's shards live in the
database of the same name. `clone_database` copies a database on every node at once (CREATE DATABASE
... TEMPLATE on each), which copies shards and metadata together: a migrated cluster database is
cloned per test like the plain template.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import psycopg

PG_BIN = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))
HOST = "127.0.0.1"
WORKERS = 2
STATE = "cluster.json"
DEFAULT_DIR = Path(tempfile.gettempdir()) / "quota-ledger-citus"
# A node's settings. Durability off: a throwaway cluster for tests and benchmarks, like CI's own.
NODE_CONF = """
listen_addresses = '{host}'
port = {port}
unix_socket_directories = '{dir}'
shared_preload_libraries = 'citus'
max_connections = 300
fsync = off
full_page_writes = off
max_prepared_transactions = 200
# Tests and benchmarks of one machine: a few shards per worker are what routing needs to show, and
# a cloned test database copies every shard.
citus.shard_count = 4
"""


def pg_lib_dir() -> Path:
    out = subprocess.run([str(PG_BIN / "pg_config"), "--pkglibdir"], capture_output=True, text=True)
    return Path(out.stdout.strip()) if out.returncode == 0 else PG_BIN.parent / "lib"


def unavailable_reason() -> str | None:
    """Why no local cluster can start here, or None when one can."""
    if not (PG_BIN / "initdb").exists():
        return f"no PostgreSQL server binaries in {PG_BIN}"
    if not (pg_lib_dir() / "citus.so").exists():
        return "the citus extension is not installed (in CI here: ../shared/citus/install)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _as_owner(argv: Sequence[str], user: str | None) -> list[str]:
    """PostgreSQL refuses to run as root: as root, run the command as `user`."""
    return ["runuser", "-u", user, "--", *argv] if user else list(argv)


@dataclass
class Cluster:
    """The nodes of one local cluster; `coordinator` is nodes[0]."""

    root: str
    ports: list[int]
    user: str | None  # the OS user the nodes run as when started by root

    @property
    def coordinator_port(self) -> int:
        return self.ports[0]

    def url(self, database: str = "postgres", user: str = "postgres") -> str:
        return f"postgresql://{user}@{HOST}:{self.coordinator_port}/{database}"

    def node_url(self, port: int, database: str = "postgres") -> str:
        return f"postgresql://postgres@{HOST}:{port}/{database}"

    def _data(self, i: int) -> Path:
        return Path(self.root) / f"node{i}"

    def _run(self, argv: Sequence[str]) -> None:
        subprocess.run(_as_owner(argv, self.user), check=True, capture_output=True, cwd="/")

    def start(self) -> None:
        for i, port in enumerate(self.ports):
            data = self._data(i)
            if not (data / "PG_VERSION").exists():
                initdb = [str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust"]
                self._run([*initdb, "-E", "UTF8", "--no-sync"])
                with open(data / "postgresql.conf", "a") as conf:
                    conf.write(NODE_CONF.format(host=HOST, port=port, dir=self.root))
            pg_ctl = [str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(data / "log")]
            self._run([*pg_ctl, "-w", "-t", "60", "start"])
        for port in self.ports:
            with psycopg.connect(self.node_url(port), autocommit=True) as c:
                c.execute("CREATE EXTENSION IF NOT EXISTS citus")
        self.add_nodes("postgres")

    def add_nodes(self, database: str) -> None:
        """Register the workers with the coordinator's metadata of `database` (once per database)."""
        with psycopg.connect(self.url(database), autocommit=True) as c:
            c.execute("SELECT citus_set_coordinator_host(%s, %s)", (HOST, self.coordinator_port))
            for port in self.ports[1:]:
                c.execute("SELECT citus_add_node(%s, %s)", (HOST, port))

    def create_database(self, name: str) -> str:
        """An empty database with the citus extension on every node, its workers registered."""
        for port in self.ports:
            with psycopg.connect(self.node_url(port), autocommit=True) as c:
                c.execute(f'CREATE DATABASE "{name}"')
            with psycopg.connect(self.node_url(port, name), autocommit=True) as c:
                c.execute("CREATE EXTENSION citus")
        self.add_nodes(name)
        return self.url(name)

    def clone_database(self, template: str, name: str) -> str:
        """`template` copied on every node: the coordinator's metadata and the workers' shards.

        Citus keeps sessions of its own in a database it was used in (its maintenance daemon, the
        coordinator's cached connections to the workers), and a template must have none: they are
        ended, and the copy retried if one came back meanwhile."""

        def copy(port: int) -> None:
            with psycopg.connect(self.node_url(port), autocommit=True) as c:
                for attempt in range(50):
                    c.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE datname = %s AND pid <> pg_backend_pid()",
                        (template,),
                    )
                    try:
                        c.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}" STRATEGY FILE_COPY')
                        return
                    except psycopg.errors.ObjectInUse:
                        if attempt == 49:
                            raise
                        time.sleep(0.05)

        self._each_node(copy)
        return self.url(name)

    def drop_database(self, name: str) -> None:
        def drop(port: int) -> None:
            with psycopg.connect(self.node_url(port), autocommit=True) as c:
                # FORCE ends sessions, not Citus's maintenance daemon, which reconnects unless the
                # database refuses connections.
                try:
                    c.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
                except psycopg.errors.InvalidCatalogName:
                    return
                for attempt in range(100):
                    try:
                        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                        return
                    except psycopg.errors.ObjectInUse:
                        if attempt == 99:
                            raise
                        time.sleep(0.05)

        self._each_node(drop)

    def _each_node(self, work: Callable[[int], None]) -> None:
        with ThreadPoolExecutor(max_workers=len(self.ports)) as pool:
            for done in [pool.submit(work, port) for port in self.ports]:
                done.result()

    def stop(self) -> None:
        for i in reversed(range(len(self.ports))):
            data = self._data(i)
            if (data / "postmaster.pid").exists():
                self._run([str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"])

    def save(self) -> None:
        (Path(self.root) / STATE).write_text(json.dumps(asdict(self)))


def load(root: Path) -> Cluster | None:
    state = root / STATE
    return Cluster(**json.loads(state.read_text())) if state.exists() else None


def start(root: Path | None = None) -> Cluster:
    """Start a cluster in `root` (a new temporary folder when None), or the one already there."""
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    if root is None:
        root = Path(tempfile.mkdtemp(prefix="ql-citus-"))
    root.mkdir(parents=True, exist_ok=True)
    cluster = load(root)
    if cluster is None:
        user = "postgres" if os.geteuid() == 0 else None
        cluster = Cluster(root=str(root), ports=[_free_port() for _ in range(1 + WORKERS)], user=user)
        if user:
            shutil.chown(root, user)
        cluster.save()
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster


def destroy(cluster: Cluster) -> None:
    cluster.stop()
    shutil.rmtree(cluster.root, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="citus-cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["start", "stop", "url"])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="the cluster's folder (%(default)s)")
    args = parser.parse_args(argv)
    if args.command == "start":
        print(start(args.dir).url())
        return 0
    cluster = load(args.dir)
    if cluster is None:
        print(f"no cluster in {args.dir}", file=sys.stderr)
        return 1
    if args.command == "url":
        print(cluster.url())
    else:
        destroy(cluster)
    return 0


if __name__ == "__main__":
    sys.exit(main())
