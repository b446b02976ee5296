"""What a request needs from the process: settings, the connection pool and the plan config."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from flask import current_app
from psycopg_pool import ConnectionPool

from service.billing.plans import PlanConfig
from service.config import Settings
from service.db import Connection, Database


@dataclass
class Runtime:
    settings: Settings
    db: Database
    plans: PlanConfig

    @property
    def pool(self) -> ConnectionPool[Connection]:
        return self.db.pool

    @contextmanager
    def connection(self, *, timeout: float | None = None) -> Iterator[Connection]:
        with self.db.connection(timeout=timeout) as conn:
            yield conn


def runtime() -> Runtime:
    rt: Runtime = current_app.extensions["quota"]
    return rt
