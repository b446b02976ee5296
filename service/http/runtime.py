"""What a request needs from the process: settings, the connection pool and the plan config."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from flask import current_app
from psycopg_pool import ConnectionPool

from service.billing.plans import PlanConfig
from service.config import Settings
from service.db import Connection


@dataclass
class Runtime:
    settings: Settings
    pool: ConnectionPool[Connection]
    plans: PlanConfig

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        if self.pool.closed:
            self.pool.open(wait=False)
        with self.pool.connection() as conn:
            yield conn


def runtime() -> Runtime:
    rt: Runtime = current_app.extensions["quota"]
    return rt
