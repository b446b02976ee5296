"""The production web server: gunicorn with threaded workers (gthread) in front of the Flask app.

Why threads: a sync worker is held by one connection until its request has arrived in full, so a
few clients that send their headers or body slowly hold every worker and nothing else is answered.
A gthread worker parks idle connections in its poller and serves requests on a pool of threads;
a slow client holds one thread, not the process. The database pool (DB_POOL_SIZE per process) is
taken only once a request has arrived, so slow clients never hold a database connection either.
In front of a public network, put a buffering proxy (compose: nginx) so that slow clients never
reach gunicorn at all (README: Deploying).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

# Per worker process. A slow client holds one thread until its request has arrived; requests that
# have arrived wait for one of the DB_POOL_SIZE connections, not for a thread.
DEFAULT_THREADS = 16
# Prometheus multiprocess folders are named after the master that made them: a master that crashed
# (kill -9) never removed its own, and the next start does.
METRICS_DIR_PREFIX = "quota-metrics-"
_METRICS_DIR = re.compile(re.escape(METRICS_DIR_PREFIX) + r"(\d+)-")
_PR_SET_PDEATHSIG = 1


class PortInUse(RuntimeError):
    """The address to bind is taken by another process."""


def check_bind(bind: str) -> None:
    """Raise PortInUse when HOST:PORT cannot be listened on. gunicorn would retry for five seconds
    and then exit with a traceback; this says it in one line, before anything starts."""
    if bind.startswith(("unix:", "fd://")):
        return
    host, _, port = bind.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # as gunicorn binds: a connection of an earlier run still in TIME_WAIT is no conflict
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, int(port)))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise PortInUse(
                    f"port {port} on {host} is already in use; choose another with --bind HOST:PORT"
                ) from None
            raise


def write_json_error(sock: socket.socket, status_int: int, reason: str, mesg: str) -> None:
    """gunicorn's own refusals (a request line over 4094 bytes: 414, too many or too large header
    fields: 431, a malformed request: 400) as the API's JSON error body instead of an HTML page."""
    from gunicorn import util as gunicorn_util
    from werkzeug.http import HTTP_STATUS_CODES

    from service.http.errors import error_code

    name = HTTP_STATUS_CODES.get(status_int, reason)
    body = json.dumps({"error": error_code(name), "message": mesg or name}).encode()
    head = (
        f"HTTP/1.1 {status_int} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    gunicorn_util.write_nonblock(sock, head.encode("latin-1") + body)


def honour_connection_close() -> None:
    """gunicorn drops every hop-by-hop header an app sets, Connection included, and decides itself
    whether to keep the connection. Make an app's `Connection: close` close it (and say so): the app
    knows when a request's body was left unread (service/http/inbound.py)."""
    from gunicorn.http import wsgi

    class Response(wsgi.Response):  # type: ignore[misc]
        def process_headers(self, headers: list[tuple[str, str]]) -> None:
            super().process_headers(headers)
            if any(n.lower() == "connection" and v.strip().lower() == "close" for n, v in headers):
                self.force_close()

    wsgi.Response = Response


def worker_class() -> type:
    """gunicorn's gthread worker, except that it lets go of the listening socket as soon as it stops
    accepting. Its master gone (kill -9), a gthread worker notices within a second ("Parent changed")
    and then finishes its connections for up to the graceful timeout (30 s) with the listener still
    open: new connections wait in its backlog unanswered and a new server cannot bind the port. The
    kernel also tells it at once that its master died (SIGTERM, Linux's parent-death signal)."""
    from gunicorn.workers.gthread import ThreadWorker

    class Worker(ThreadWorker):  # type: ignore[misc]
        def init_process(self) -> None:
            if sys.platform.startswith("linux"):
                libc = ctypes.CDLL(None, use_errno=True)
                libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
            if os.getppid() != self.ppid:  # the master died before the signal was asked for
                self.alive = False
            super().init_process()

        def is_parent_alive(self) -> bool:
            if super().is_parent_alive():
                return True
            self.alive = False
            return False

        def set_accept_enabled(self, enabled: bool) -> None:
            super().set_accept_enabled(enabled)
            if not enabled and not self.alive:
                for listener in self.sockets:
                    listener.close()

    return Worker


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
    """Say once, in the arbiter, why the console is off (each worker builds its app without it)."""
    from service.config import Settings
    from service.console import disabled_reason

    try:
        settings = Settings.from_env()
    except RuntimeError:  # the workers' create_app says what is wrong with the settings
        return
    reason = disabled_reason(settings)
    if reason is not None:
        print(f"quota-ledger serve: {reason}", file=sys.stderr, flush=True)


def serve(*, bind: str, workers: int, threads: int = DEFAULT_THREADS, access_log: bool = False) -> None:
    """Run gunicorn until it is stopped. Raises PortInUse before starting when `bind` is taken."""
    from gunicorn import util as gunicorn_util
    from gunicorn.app.base import BaseApplication

    check_bind(bind)
    console_off()
    # gunicorn writes its refusals through this module function (workers.base.Worker.handle_error);
    # replaced here, in the arbiter, so that every forked worker inherits it.
    gunicorn_util.write_error = write_json_error
    honour_connection_close()

    # Prometheus multiprocess mode: every worker writes samples to files in this directory.
    own_metrics_dir = not os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if own_metrics_dir:
        with contextlib.suppress(OSError):
            remove_stale_metrics_dirs(Path(tempfile.gettempdir()))
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(
            prefix=f"{METRICS_DIR_PREFIX}{os.getpid()}-"
        )
    arbiter_pid = os.getpid()

    def child_exit(server: Any, worker: Any) -> None:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]

    class Server(BaseApplication):  # type: ignore[misc]
        def load_config(self) -> None:
            self.cfg.set("bind", bind)
            self.cfg.set("workers", workers)
            self.cfg.set("worker_class", worker_class())
            self.cfg.set("threads", threads)
            self.cfg.set("child_exit", child_exit)
            self.cfg.set("accesslog", "-" if access_log else None)
            self.cfg.set("proc_name", "quota-ledger")
            # gunicorn's control socket is one path per user: concurrent servers would share it
            self.cfg.set("control_socket_disable", True)

        def load(self) -> Any:
            from service import create_app

            return create_app()

    try:
        Server().run()
    finally:
        # Workers are forked inside run() and leave through here too: only the arbiter cleans up.
        if own_metrics_dir and os.getpid() == arbiter_pid:
            shutil.rmtree(os.environ.pop("PROMETHEUS_MULTIPROC_DIR"), ignore_errors=True)
