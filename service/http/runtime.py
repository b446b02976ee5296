"""What a request needs from the process: settings, the connection pools and the plan config."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field

from flask import current_app
from psycopg_pool import ConnectionPool

from service.config import Settings
from service.db import Connection, Database
from service.http.errors import ApiError
from service.plans import PlanConfig


class ExportsBusy(ApiError):
    """EXPORT_POOL_SIZE exports are already running in this process; retry later."""

    status, code = 503, "exports_busy"


@dataclass
class Runtime:
    settings: Settings
    db: Database
    plans: PlanConfig
    # The exports' own pool (EXPORT_POOL_SIZE): a slow reader holds one of these, never a take's.
    exports: Database
    exports_running: int = field(default=0, init=False)
    _exports_lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    @property
    def pool(self) -> ConnectionPool[Connection]:
        return self.db.pool

    def connection(self, *, timeout: float | None = None) -> AbstractContextManager[Connection]:
        """The pool's own context manager (Database.connection), not one wrapped around it: a
        generator layer more on every request's checkout and return buys nothing."""
        return self.db.connection(timeout=timeout)

    def close(self) -> None:
        self.db.close()
        self.exports.close()

    @contextmanager
    def export_connection(self) -> Iterator[Connection]:
        """A connection of the export pool. Raises ExportsBusy at once, without waiting, when every
        one is taken: an export that queued would hold a server thread for as long as another
        export's reader is slow."""
        with self._exports_lock:
            if self.exports_running >= self.exports.pool.max_size:
                raise ExportsBusy(f"{self.exports_running} exports are running in this process; retry later")
            self.exports_running += 1
        try:
            with self.exports.connection() as conn:
                yield conn
        finally:
            with self._exports_lock:
                self.exports_running -= 1


def runtime() -> Runtime:
    rt: Runtime = current_app.extensions["quota"]
    return rt
