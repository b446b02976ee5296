"""What a request needs from the process: settings, the connection pool and the plan config."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass

from flask import current_app
from psycopg_pool import ConnectionPool

from service.config import Settings
from service.db import Connection, Database
from service.plans import PlanConfig


@dataclass
class Runtime:
    settings: Settings
    db: Database
    plans: PlanConfig

    @property
    def pool(self) -> ConnectionPool[Connection]:
        return self.db.pool

    def connection(self, *, timeout: float | None = None) -> AbstractContextManager[Connection]:
        """The pool's own context manager (Database.connection), not one wrapped around it: a
        generator layer more on every request's checkout and return buys nothing."""
        return self.db.connection(timeout=timeout)


def runtime() -> Runtime:
    rt: Runtime = current_app.extensions["quota"]
    return rt
