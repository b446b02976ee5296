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

import errno
import json
import os
import shutil
import socket
import tempfile
from typing import Any

# Per worker process. A slow client holds one thread until its request has arrived; requests that
# have arrived wait for one of the DB_POOL_SIZE connections, not for a thread.
DEFAULT_THREADS = 16


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


def serve(*, bind: str, workers: int, threads: int = DEFAULT_THREADS, access_log: bool = False) -> None:
    """Run gunicorn until it is stopped. Raises PortInUse before starting when `bind` is taken."""
    from gunicorn import util as gunicorn_util
    from gunicorn.app.base import BaseApplication

    check_bind(bind)
    # gunicorn writes its refusals through this module function (workers.base.Worker.handle_error);
    # replaced here, in the arbiter, so that every forked worker inherits it.
    gunicorn_util.write_error = write_json_error

    # Prometheus multiprocess mode: every worker writes samples to files in this directory.
    own_metrics_dir = not os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if own_metrics_dir:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="quota-metrics-")
    arbiter_pid = os.getpid()

    def child_exit(server: Any, worker: Any) -> None:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]

    class Server(BaseApplication):  # type: ignore[misc]
        def load_config(self) -> None:
            self.cfg.set("bind", bind)
            self.cfg.set("workers", workers)
            self.cfg.set("worker_class", "gthread")
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
