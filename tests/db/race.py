"""Fire one function per connection at the same instant (a barrier) and collect what each returned."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def race(conns: Sequence[Any], fn: Callable[[Any], T], *, timeout: float = 60) -> list[T | BaseException]:
    """Run fn(conn) in one thread per connection, all released together; returns each result or
    the exception it raised, in connection order."""
    barrier = threading.Barrier(len(conns))
    results: list[T | BaseException] = [RuntimeError("did not finish")] * len(conns)

    def run(i: int, conn: Any) -> None:
        try:
            barrier.wait(timeout=timeout)
            results[i] = fn(conn)
        except BaseException as e:
            results[i] = e

    threads = [threading.Thread(target=run, args=(i, c), daemon=True) for i, c in enumerate(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a racing thread hung"
    return results
