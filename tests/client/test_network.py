"""Lost answers and no answers, against the running service: a take or release whose answer never
arrived is retried with the same idempotency key and counts once."""

from __future__ import annotations

import asyncio
import socket

import pytest
from quota_client import AsyncQuotaClient, AuthError, ConnectionFailedError, QuotaClient

from service.keys import create_key
from tests.client.conftest import FAST
from tests.db.helpers import assert_counter_matches_ledger, ledger_rows


@pytest.fixture
def quota(proxy, product_key, acc):
    with QuotaClient(proxy.url, product_key, **FAST) as client:
        client.ensure_account(acc)
        yield client


def test_a_take_whose_answer_was_lost_is_retried_and_counts_once(quota, proxy, conn, acc):
    proxy.drop_next(1)
    took = quota.take(acc, "urls", units=2)
    assert proxy.dropped == 1
    assert took.granted and took.replayed and took.used == 2
    [row] = ledger_rows(conn, acc, kind="take")
    assert (row["id"], row["units"], row["idempotency_key"]) == (took.take_id, 2, took.idempotency_key)
    assert assert_counter_matches_ledger(conn, acc, "urls")["used"] == 2


def test_the_callers_own_key_is_the_one_retried(quota, proxy, conn, acc):
    proxy.drop_next(2)
    took = quota.take(acc, "urls", idempotency_key="order-9")
    assert proxy.dropped == 2 and took.replayed and took.idempotency_key == "order-9"
    assert [r["idempotency_key"] for r in ledger_rows(conn, acc, kind="take")] == ["order-9"]


def test_a_timeout_is_retried_and_the_take_counts_once(proxy, product_key, conn, acc):
    with QuotaClient(proxy.url, product_key, **{**FAST, "timeout": 0.5}) as quota:
        quota.ensure_account(acc)
        proxy.stall_next(1)
        took = quota.take(acc, "urls")
    assert proxy.dropped == 1 and took.replayed
    assert len(ledger_rows(conn, acc, kind="take")) == 1
    assert assert_counter_matches_ledger(conn, acc, "urls")["used"] == 1


def test_a_release_whose_answer_was_lost_is_retried_and_gives_back_once(quota, proxy, conn, acc):
    took = quota.take(acc, "urls", units=3)
    proxy.drop_next(1)
    released = quota.release(took)
    # The first attempt gave the units back; the retry is told so (see ReleaseResult).
    assert (released.released, released.reason) == (False, "already_released")
    assert len(ledger_rows(conn, acc, kind="release")) == 1
    assert assert_counter_matches_ledger(conn, acc, "urls")["used"] == 0


def test_no_answer_at_all_raises_connection_failed_after_the_retries(acc):
    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    with (
        QuotaClient(url, "key", **{**FAST, "retries": 2}) as quota,
        pytest.raises(ConnectionFailedError) as e,
    ):
        quota.take(acc, "urls")
    assert "3 attempt(s)" in str(e.value)


def test_auth_errors_carry_the_code_and_are_not_retried(proxy, conn, acc):
    finance = create_key(conn, name=f"finance-{acc}", role="finance")
    for key, status, code in [("not-a-key", 401, "unauthorized"), (finance, 403, "forbidden")]:
        before = proxy.requests
        with QuotaClient(proxy.url, key, **FAST) as quota, pytest.raises(AuthError) as e:
            quota.take(acc, "urls")
        assert (e.value.status, e.value.code, proxy.requests - before) == (status, code, 1)


def test_a_slot_whose_take_got_no_answer_gives_it_back(proxy, product_key, conn, acc):
    """Every attempt timed out after the service applied the first: the slot raises, and what the
    service holds under the slot's key is released (a take and its release in the ledger)."""
    # A timeout long enough for the look-up to get its answers on a loaded machine.
    with QuotaClient(proxy.url, product_key, **{**FAST, "timeout": 1.5, "retries": 1}) as quota:
        quota.ensure_account(acc)
        proxy.stall_next(2)
        with pytest.raises(ConnectionFailedError), quota.slot(acc, "urls"):
            pytest.fail("the block ran")
    assert proxy.dropped == 2
    [take] = ledger_rows(conn, acc, kind="take")
    [release] = ledger_rows(conn, acc, kind="release")
    assert release["take_id"] == take["id"] and take["idempotency_key"].startswith("qc-")
    assert assert_counter_matches_ledger(conn, acc, "urls")["used"] == 0


@pytest.mark.anyio
async def test_async_a_slot_cancelled_by_a_timeout_leaves_a_take_and_its_release(
    proxy, product_key, conn, acc
):
    async with AsyncQuotaClient(proxy.url, product_key, **FAST) as quota:
        await quota.ensure_account(acc)
        proxy.stall_next(1)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5), quota.slot(acc, "urls"):
                pytest.fail("the block ran")
    [take] = ledger_rows(conn, acc, kind="take")
    [release] = ledger_rows(conn, acc, kind="release")
    assert release["take_id"] == take["id"]
    assert assert_counter_matches_ledger(conn, acc, "urls")["used"] == 0


@pytest.mark.anyio
async def test_async_a_take_whose_answer_was_lost_counts_once(proxy, product_key, conn, acc):
    async with AsyncQuotaClient(proxy.url, product_key, **FAST) as quota:
        await quota.ensure_account(acc)
        proxy.drop_next(1)
        took = await quota.take(acc, "urls")
        assert took.granted and took.replayed and proxy.dropped == 1
        assert (await quota.usage(acc, "urls")).used == 1
    assert len(ledger_rows(conn, acc, kind="take")) == 1
