from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest

THREADS = 50


@pytest.fixture
def connect(db_url: str) -> Iterator[Callable[[int], list[psycopg.Connection[Any]]]]:
    """connect(n): n autocommit connections of their own to this test's database, closed afterwards."""
    opened: list[psycopg.Connection[Any]] = []

    def connect(n: int) -> list[psycopg.Connection[Any]]:
        with ThreadPoolExecutor(max_workers=min(n, 16)) as pool:
            new = list(pool.map(lambda _: psycopg.connect(db_url, autocommit=True), range(n)))
        opened.extend(new)
        return new

    yield connect
    for c in opened:
        c.close()
