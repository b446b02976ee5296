"""The monthly reset paces itself: batches fill at most `duty` of the wall time (a batch slowed by
a busy database is followed by a longer sleep), and the rate never falls below `min_rate`."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

from service.quota import reset
from service.quota.reset import pace
from tests.db.test_plans_after_bulk_writes import ACCOUNTS, AT, seed


@pytest.mark.parametrize(
    ("took", "counters", "duty", "min_rate", "sleep"),
    [
        (0.01, 500, 0.1, 1500.0, 0.09),  # quiet: 10 ms of work, 90 ms of rest
        (0.04, 500, 0.1, 1500.0, 500 / 1500 - 0.04),  # busy: the rate floor caps the rest
        (0.5, 500, 0.1, 1500.0, 0.0),  # slower than the floor already: no rest at all
        (0.01, 500, 1.0, 1500.0, 0.0),  # duty 1: no pacing
        (0.01, 0, 0.1, 1500.0, 0.0),  # an empty batch (a restart from the top) costs no rest
    ],
)
def test_pace(took: float, counters: int, duty: float, min_rate: float, sleep: float) -> None:
    assert pace(took, counters, duty=duty, min_rate=min_rate) == pytest.approx(sleep)


def test_a_paced_reset_keeps_its_minimum_rate_and_no_more(conn: psycopg.Connection[Any]) -> None:
    seed(conn)  # ACCOUNTS x 3 counters
    counters = ACCOUNTS * 3
    t = time.monotonic()
    # duty 0.001 would rest a thousand times each batch's work: the floor rate decides
    outcome = reset.reset_month(conn, at=AT, batch_size=1000, duty=0.001, min_rate=counters / 2.0)
    took = time.monotonic() - t
    assert outcome.status == "done" and outcome.counters_reset == counters
    assert 1.8 < took < 6.0, took


def test_bad_pacing_arguments_are_refused(conn: psycopg.Connection[Any]) -> None:
    for kwargs in ({"duty": 0.0}, {"duty": 1.5}, {"min_rate": 0.0}):
        with pytest.raises(ValueError):
            reset.reset_month(conn, at=AT, **kwargs)
