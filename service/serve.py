"""The production web server: granian (its WSGI mode) in front of the Flask app.

Why granian: it reads requests and writes answers in Rust, and calls the app on a pool of blocking
threads only once a request's head has arrived, so a client that sends its headers slowly holds no
thread at all, and one that sends its body slowly holds one thread, not the process. It serves our
take at about 0.6-0.8 of the CPU per request of gunicorn's threaded workers (bench/README.md, "Which
server"). The database pool (DB_POOL_SIZE per process) is taken only once a request has arrived.
In front of a public network, put a buffering proxy (compose: nginx) so that slow clients never
reach the server at all (docs/operations.md).

What `serve` adds to granian: a clear line for a taken port, the workers' exit when the master dies,
the Prometheus folder cleaned up, a send that stalls for EXPORT_IDLE_TIMEOUT ends its connection, and
a respawn of a worker that crashed.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

# Blocking threads per worker process, as many as a process has database connections by default
# (DB_POOL_SIZE): a request that has arrived does not wait in Python for a connection. With twice as
# many threads as connections (16 and 4, the defaults before), handing connections over between
# threads cost ~10% more web CPU per take and ~10% of the takes/s (bench/README.md, 2026-12-07,
# fourth session). A client that sends its body slowly holds a thread until its request has arrived.
DEFAULT_THREADS = 8
# The request's head (request line and headers) must fit the server's read buffer; a larger one is
# answered 431 by granian itself, with no body (docs/api.md). The app refuses a long target itself
# (414).
HEAD_BUFFER_BYTES = 16 * 1024
# Connections a worker serves at once (one that has not sent its whole head holds one for at most
# HEADER_TIMEOUT_MS), and the listener's queue of connections not yet accepted.
CONNECTIONS_PER_WORKER = 1000
# A worker's descriptors besides its clients': database and Redis connections, metric files, logs.
OPEN_FILES_BESIDES_CONNECTIONS = 1000
BACKLOG = 2048
HEADER_TIMEOUT_MS = 10_000
# A stopping worker finishes the requests it has for this long (SIGTERM to the master).
GRACEFUL_SECONDS = 30
# Prometheus multiprocess folders are named after the master that made them: a master that crashed
# (kill -9) never removed its own, and the next start does.
METRICS_DIR_PREFIX = "quota-metrics-"
_METRICS_DIR = re.compile(re.escape(METRICS_DIR_PREFIX) + r"(\d+)-")
_METRICS_FILE_PID = re.compile(r"_(\d+)\.db\Z")
_PR_SET_PDEATHSIG = 1


class PortInUse(RuntimeError):
    """The address to bind is taken by another process, or cannot be bound at all."""


def _tcp_address(bind: str) -> tuple[socket.AddressFamily, tuple[Any, ...]]:
    """HOST:PORT (a name, an IPv4 address, or [IPv6]) as the family and address to bind."""
    host, _, port = bind.rpartition(":")
    try:
        infos = socket.getaddrinfo(
            host.strip("[]") or "0.0.0.0", int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except (ValueError, OSError) as e:
        raise PortInUse(f"cannot listen on {bind!r} ({e}); give --bind HOST:PORT or unix:PATH") from None
    family, _, _, _, address = infos[0]
    return family, address


def _tcp_listener(bind: str, backlog: int) -> socket.socket:
    """A listening socket on HOST:PORT. SO_REUSEADDR (a connection of an earlier run still in
    TIME_WAIT is no conflict), never SO_REUSEPORT (another server on the port must fail to bind,
    not share its traffic). Raises PortInUse when the address is taken."""
    family, address = _tcp_address(bind)
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # as granian's own listener: accepted connections inherit it, and an answer is sent at once
        # rather than held back by Nagle's algorithm (measured: ~9% more web CPU per take without)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.bind(address)
        s.listen(backlog)
    except OSError as e:
        s.close()
        if e.errno == errno.EADDRINUSE:
            raise PortInUse(
                f"port {address[1]} on {address[0]} is already in use; choose another with --bind HOST:PORT"
            ) from None
        raise PortInUse(f"cannot listen on {bind!r} ({e.strerror})") from None
    return s


def check_bind(bind: str) -> None:
    """Raise PortInUse, in one line and before anything starts, when `bind` cannot be listened on
    (the server would exit with a traceback). A unix socket file that nothing answers on any more
    (a server that was killed) is removed; one that answers is in use."""
    if bind.startswith("unix:"):
        path = bind[len("unix:") :]
        if not os.path.exists(path):
            return
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(path)
            except ConnectionRefusedError:
                os.unlink(path)  # stale: its server is gone
                return
            except OSError as e:
                raise PortInUse(
                    f"cannot listen on {path} ({e.strerror}); choose another with --bind"
                ) from None
        raise PortInUse(f"{path} is already in use; choose another with --bind unix:PATH")
    _tcp_listener(bind, 1).close()


def remove_stale_metrics_dirs(root: Path) -> None:
    """Remove the Prometheus folders (METRICS_DIR_PREFIX) of masters that no longer run."""
    for path in root.glob(METRICS_DIR_PREFIX + "*"):
        m = _METRICS_DIR.match(path.name)
        if m is None or not path.is_dir() or path.stat().st_uid != os.geteuid():
            continue
        try:
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:  # alive, another user's
            pass


def console_off() -> None:
    """Say once, in the master, why the console is off (each worker builds its app without it)."""
    from service.config import Settings
    from service.console import disabled_reason

    try:
        settings = Settings.from_env()
    except RuntimeError:  # the workers' create_app says what is wrong with the settings
        return
    reason = disabled_reason(settings)
    if reason is not None:
        print(f"quota-ledger serve: {reason}", file=sys.stderr, flush=True)


def forget_dead_workers(metrics_dir: Path) -> None:
    """Drop the live-gauge samples of workers that no longer run (a crashed worker, respawned), so
    that `livesum` gauges add up the running workers only. Counters of dead workers stay: they are
    the process's totals."""
    from prometheus_client import multiprocess

    pids = {int(m.group(1)) for f in metrics_dir.glob("*.db") if (m := _METRICS_FILE_PID.search(f.name))}
    for pid in pids - {os.getpid()}:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            multiprocess.mark_process_dead(pid, str(metrics_dir))  # type: ignore[no-untyped-call]
        except PermissionError:
            pass


def worker_app(master: int, target: str) -> Any:
    """Build the app in a worker process.

    When its master dies the kernel kills the worker (Linux's parent-death signal): after a kill -9
    of the master no orphan goes on serving, and the port is free at once. SIGKILL: the master is
    gone, so there is no graceful stop to coordinate; what the worker's requests had begun rolls
    back with their transactions, as on any crash, and a client retries with its idempotency key.
    Elsewhere than Linux orphans are not stopped (granian does not watch its parent)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != master:  # the master died before the signal was asked for
        os.kill(os.getpid(), signal.SIGKILL)
    from service import create_app

    return create_app()


def server_class(send_timeout: float) -> type:
    """granian's multi-process server, with what `serve` needs of it:

    - Its workers accept on one listener, made here, that has a send timeout: a connection whose
      peer takes nothing for `send_timeout` seconds (a full window) is ended by the kernel
      (TCP_USER_TIMEOUT, inherited by every accepted connection), which ends the response and gives
      back what it held (a ledger export's cursor and connection: docs/design/exports-and-readiness.md).
      granian has no write timeout of its own, and on Linux each of its workers would open its own
      listener (SO_REUSEPORT), where no option can be set and which another server could join.
      A `unix:` socket is granian's own, without the send timeout.
    - After workers are replaced (a crash, SIGHUP), the old ones' live gauges are dropped, so that
      `livesum` gauges add up the running workers only.
    - A forked worker keeps the master's handler of SIGTERM and SIGINT until granian installs its
      own, once the app is built; run in a worker, that handler did nothing, so a stop right after
      a start waited GRACEFUL_SECONDS for it. In a worker it now ends the worker.

    These reach into granian (`_init_shared_socket`, `_respawn_workers`, `signal_handler_interrupt`):
    granian is pinned to a minor."""
    from granian._granian import SocketHolder
    from granian.server.mp import MPServer

    class Server(MPServer):
        def _init_shared_socket(self) -> None:
            if self.bind_uds:
                super()._init_shared_socket()  # type: ignore[no-untyped-call]
                return
            listener = _tcp_listener(f"[{self.bind_addr}]:{self.bind_port}", self.backlog)
            listener.set_inheritable(True)
            if hasattr(socket, "TCP_USER_TIMEOUT"):
                listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(send_timeout * 1000))
            # granian declares the fd and its holder None until its own code sets them
            self._ssp, self._sso = None, listener
            self._sfd = listener.fileno()  # type: ignore[assignment]
            self._shd = SocketHolder(listener.fileno(), False, self.backlog)  # type: ignore[call-arg,assignment]

        def signal_handler_interrupt(self, *args: Any, **kwargs: Any) -> None:
            if os.getpid() != self.pid:  # a worker that has not installed its own handlers yet
                os._exit(0)
            super().signal_handler_interrupt(*args, **kwargs)  # type: ignore[no-untyped-call]

        def _respawn_workers(self, *args: Any, **kwargs: Any) -> None:
            super()._respawn_workers(*args, **kwargs)
            metrics_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
            if metrics_dir:
                with contextlib.suppress(OSError):
                    forget_dead_workers(Path(metrics_dir))

    return Server


def raise_open_files(needed: int) -> int:
    """Raise this process's soft limit of open files towards `needed` (never past the hard limit),
    for its workers to inherit; returns the soft limit now. A common default of 1,024 would leave
    a worker that holds its CONNECTIONS_PER_WORKER clients without descriptors for its database
    connections, and its accepts failing."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        soft = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return soft


def serve(*, bind: str, workers: int, threads: int = DEFAULT_THREADS, access_log: bool = False) -> None:
    """Run granian until it is stopped. Raises PortInUse before starting when `bind` is taken."""
    from granian.constants import HTTPModes, Interfaces
    from granian.http import HTTP1Settings

    from service.config import Settings

    check_bind(bind)
    console_off()
    raise_open_files(CONNECTIONS_PER_WORKER + OPEN_FILES_BESIDES_CONNECTIONS)
    try:
        send_timeout = Settings.from_env().export_idle_timeout
    except RuntimeError:  # the workers' create_app says what is wrong with the settings
        send_timeout = 300.0

    # Prometheus multiprocess mode: every worker writes samples to files in this directory.
    own_metrics_dir = not os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if own_metrics_dir:
        with contextlib.suppress(OSError):
            remove_stale_metrics_dirs(Path(tempfile.gettempdir()))
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(
            prefix=f"{METRICS_DIR_PREFIX}{os.getpid()}-"
        )
    if bind.startswith("unix:"):
        where: dict[str, Any] = {"uds": Path(bind[len("unix:") :])}
    else:
        _, address = _tcp_address(bind)
        where = {"address": address[0], "port": address[1]}
    server = server_class(send_timeout)(
        "service:create_app",
        **where,
        interface=Interfaces.WSGI,
        http=HTTPModes.http1,
        websockets=False,  # WSGI has none; said here so that granian does not log that it ignores them
        workers=workers,
        blocking_threads=threads,
        # a connection holds one of a worker's `backpressure` slots until its request is read, for
        # at most the header timeout (nginx's too): as many as gunicorn's 1,000 per worker
        backlog=BACKLOG,
        backpressure=CONNECTIONS_PER_WORKER,
        http1_settings=HTTP1Settings(
            max_buffer_size=HEAD_BUFFER_BYTES, header_read_timeout=HEADER_TIMEOUT_MS
        ),
        respawn_failed_workers=True,
        workers_kill_timeout=GRACEFUL_SECONDS,
        log_access=access_log,
    )
    # Its warning that many threads "seem quite high" for the cores: ours wait for slow clients and
    # for the database, not for a core (DEFAULT_THREADS).
    logging.getLogger("_granian").addFilter(lambda record: "seems quite high" not in record.getMessage())
    master = os.getpid()
    try:
        server.serve(target_loader=partial(worker_app, master))
    finally:
        if own_metrics_dir and os.getpid() == master:  # never a worker (forked inside serve())
            shutil.rmtree(os.environ.pop("PROMETHEUS_MULTIPROC_DIR"), ignore_errors=True)
