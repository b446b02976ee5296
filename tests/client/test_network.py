"""Lost answers and no answers, against the running service: a take or release whose answer never
arrived is retried with the same idempotency key and counts once."""

from __future__ import annotations

import socket

import pytest
from quota_client import AsyncQuotaClient, ConnectionFailed, QuotaClient

from tests.client.conftest import FAST
from tests.db.helpers import assert_counter_matches_ledger, ledger_rows


@pytest.fixture
def quota(proxy, product_key):
    with QuotaClient(proxy.url, product_key, **FAST) as client:
        client.ensure_account("acc-1")
        yield client


def test_a_take_whose_answer_was_lost_is_retried_and_counts_once(quota, proxy, conn):
    proxy.drop_next(1)
    took = quota.take("acc-1", "urls", units=2)
    assert proxy.dropped == 1
    assert took.granted and took.replayed and took.used == 2
    [row] = ledger_rows(conn, "acc-1", kind="take")
    assert (row["id"], row["units"], row["idempotency_key"]) == (took.take_id, 2, took.idempotency_key)
    assert assert_counter_matches_ledger(conn, "acc-1", "urls")["used"] == 2


def test_the_callers_own_key_is_the_one_retried(quota, proxy, conn):
    proxy.drop_next(2)
    took = quota.take("acc-1", "urls", idempotency_key="order-9")
    assert proxy.dropped == 2 and took.replayed and took.idempotency_key == "order-9"
    assert [r["idempotency_key"] for r in ledger_rows(conn, "acc-1", kind="take")] == ["order-9"]


def test_a_timeout_is_retried_and_the_take_counts_once(proxy, product_key, conn):
    with QuotaClient(proxy.url, product_key, **{**FAST, "timeout": 0.5}) as quota:
        quota.ensure_account("acc-1")
        proxy.stall_next(1)
        took = quota.take("acc-1", "urls")
    assert proxy.dropped == 1 and took.replayed
    assert len(ledger_rows(conn, "acc-1", kind="take")) == 1
    assert assert_counter_matches_ledger(conn, "acc-1", "urls")["used"] == 1


def test_a_release_whose_answer_was_lost_is_retried_and_gives_back_once(quota, proxy, conn):
    took = quota.take("acc-1", "urls", units=3)
    proxy.drop_next(1)
    released = quota.release(took)
    # The first attempt gave the units back; the retry is told so (see ReleaseResult).
    assert (released.released, released.reason) == (False, "already_released")
    assert len(ledger_rows(conn, "acc-1", kind="release")) == 1
    assert assert_counter_matches_ledger(conn, "acc-1", "urls")["used"] == 0


def test_no_answer_at_all_raises_connection_failed_after_the_retries():
    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    with QuotaClient(url, "key", **{**FAST, "retries": 2}) as quota, pytest.raises(ConnectionFailed) as e:
        quota.take("acc-1", "urls")
    assert "3 attempt(s)" in str(e.value)


@pytest.mark.anyio
async def test_async_a_take_whose_answer_was_lost_counts_once(proxy, product_key, conn):
    async with AsyncQuotaClient(proxy.url, product_key, **FAST) as quota:
        await quota.ensure_account("acc-1")
        proxy.drop_next(1)
        took = await quota.take("acc-1", "urls")
        assert took.granted and took.replayed and proxy.dropped == 1
        assert (await quota.usage("acc-1", "urls")).used == 1
    assert len(ledger_rows(conn, "acc-1", kind="take")) == 1
