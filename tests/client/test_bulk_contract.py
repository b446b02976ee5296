"""The client's multi-line takes, batches and slots of several lines (issue 24), run against the real
service and InMemoryQuota alike (tests/client/conftest.py `backend`)."""

from __future__ import annotations

import pytest
from quota_client import (
    ApiError,
    BatchItem,
    ConflictError,
    LinesExceededError,
    QuotaExceededError,
    TakeResult,
    UnknownAccountError,
    ValidationError,
)

from tests.client.conftest import interrupted_when_stalled

LINES = {"urls": 3, "exports": 2, "seats": 1}


def _used(quota, acc):
    return {m: limit.used for m, limit in quota.limits(acc).items() if m in LINES}


def test_take_lines_takes_every_line_in_order(quota, acc):
    quota.ensure_account(acc)
    taken = quota.take_lines(acc, LINES)
    assert taken.granted and not taken.replayed and taken.reason is None
    assert [(t.metric, t.units, t.used, t.granted) for t in taken.takes] == [
        ("urls", 3, 3, True),
        ("exports", 2, 2, True),
        ("seats", 1, 1, True),
    ]
    assert taken.takes[2].period is None and len({t.take_id for t in taken.takes}) == 3
    assert quota.release(taken.takes[0]).released  # each line released on its own
    assert _used(quota, acc) == {"urls": 0, "exports": 2, "seats": 1}


def test_take_lines_refused_names_every_short_line_and_takes_nothing(quota, backend, acc):
    quota.ensure_account(acc)
    backend.set_limit(acc, "exports", 1)
    refused = quota.take_lines(acc, [("urls", 3), ("exports", 2), ("seats", 2)])
    assert not refused.granted and refused.reason == "exhausted" and refused.takes == ()
    assert [(s.metric, s.units, s.remaining, s.limit) for s in refused.short] == [
        ("exports", 2, 1, 1),
        ("seats", 2, 1, 1),
    ]
    assert _used(quota, acc) == {"urls": 0, "exports": 0, "seats": 0}


def test_take_lines_with_its_key_again_returns_the_original_takes(quota, acc):
    quota.ensure_account(acc)
    first = quota.take_lines(acc, LINES, idempotency_key="lines-1")
    again = quota.take_lines(acc, LINES, idempotency_key="lines-1")
    assert again.replayed and [t.take_id for t in again.takes] == [t.take_id for t in first.takes]
    with pytest.raises(ConflictError) as reused:
        quota.take_lines(acc, {"urls": 3}, idempotency_key="lines-1")
    assert reused.value.code == "idempotency_key_reused"
    with pytest.raises(ConflictError):
        quota.take(acc, "urls", units=3, idempotency_key="lines-1")
    assert _used(quota, acc) == {"urls": 3, "exports": 2, "seats": 1}


def test_take_lines_refuses_what_a_body_may_not_be(quota, acc):
    quota.ensure_account(acc)
    for lines in ({}, [("urls", 1), ("urls", 2)], {"urls": 0}, {f"m{i}": 1 for i in range(21)}):
        with pytest.raises(ValidationError):
            quota.take_lines(acc, lines)
    with pytest.raises(ValidationError) as e:
        quota.take_lines(acc, LINES, idempotency_key="a\x1fb")
    assert "idempotency_key" in e.value.fields
    with pytest.raises(UnknownAccountError):
        quota.take_lines("nobody", LINES)


def test_take_batch_answers_each_item_as_its_single_take(quota, backend, acc):
    quota.ensure_account(acc)
    backend.set_limit(acc, "urls", 3)
    results = quota.take_batch(
        [
            BatchItem(account_id=acc, metric="urls", units=2, idempotency_key="b1"),
            BatchItem(account_id=acc, metric="urls", units=2),
            BatchItem(account_id=acc, metric="urls", units=2, idempotency_key="b1"),
            BatchItem(account_id="nobody", metric="urls"),
            BatchItem(account_id=acc, metric="urls", units=0),
            BatchItem(account_id=acc, metric="seats"),
        ]
    )
    granted, refused, replayed, unknown, invalid, seat = results
    assert isinstance(granted, TakeResult) and granted.granted and granted.used == 2
    assert isinstance(refused, TakeResult) and not refused.granted and refused.remaining == 1
    assert isinstance(replayed, TakeResult) and replayed.replayed and replayed.take_id == granted.take_id
    assert isinstance(unknown, UnknownAccountError) and unknown.status == 404
    assert isinstance(invalid, ValidationError) and "units" in invalid.fields
    assert isinstance(seat, TakeResult) and seat.granted and seat.period is None
    assert _used(quota, acc) == {"urls": 2, "exports": 0, "seats": 1}


def test_take_batch_of_no_items_is_refused_whole(quota):
    with pytest.raises(ValidationError):
        quota.take_batch([])


def test_a_retried_batch_counts_each_item_once(backend, acc):
    with backend.client() as quota:
        quota.ensure_account(acc)
        backend.fail_next(1)  # the first attempt never reaches the quota logic; the retry does
        results = quota.take_batch([BatchItem(account_id=acc, metric="urls")] * 2)
        assert all(isinstance(r, TakeResult) and r.granted for r in results)
        assert quota.usage(acc, "urls").used == 2


def test_a_slot_of_lines_keeps_them_when_the_block_succeeds(quota, acc):
    quota.ensure_account(acc)
    with quota.slot(acc, lines=LINES) as taken:
        assert [t.metric for t in taken.takes] == list(LINES)
    assert _used(quota, acc) == LINES


def test_a_slot_of_lines_refused_raises_naming_the_short_lines(quota, backend, acc):
    quota.ensure_account(acc)
    backend.set_limit(acc, "seats", 0)
    ran = []
    with pytest.raises(LinesExceededError) as e, quota.slot(acc, lines=LINES):
        ran.append(True)
    assert ran == [] and [s.metric for s in e.value.lines] == ["seats"]
    assert not isinstance(e.value, QuotaExceededError)
    assert _used(quota, acc) == {"urls": 0, "exports": 0, "seats": 0}


def test_a_slot_of_lines_gives_every_line_back_when_the_block_raises(quota, acc):
    class Boom(Exception):
        pass

    quota.ensure_account(acc)
    with pytest.raises(Boom), quota.slot(acc, lines=LINES):
        raise Boom
    assert _used(quota, acc) == {"urls": 0, "exports": 0, "seats": 0}


def test_a_slot_of_lines_interrupted_while_answered_gives_them_back(backend, acc):
    with backend.client() as quota:
        quota.ensure_account(acc)
        backend.stall_next(1)
        with (
            pytest.raises(KeyboardInterrupt),
            interrupted_when_stalled(backend),
            quota.slot(acc, lines=LINES),
        ):
            pass
        assert backend.stalled == 1
        assert _used(quota, acc) == {"urls": 0, "exports": 0, "seats": 0}


def test_a_slot_names_a_metric_or_lines(quota, acc):
    with pytest.raises(TypeError):
        quota.slot(acc, "urls", lines=LINES)  # type: ignore[call-overload]
    with pytest.raises(TypeError):
        quota.slot(acc)  # type: ignore[call-overload]


@pytest.mark.anyio
async def test_the_async_client_takes_lines_and_batches(backend, acc):
    async with backend.async_client() as quota:
        await quota.ensure_account(acc)
        taken = await quota.take_lines(acc, LINES)
        assert taken.granted and len(taken.takes) == 3
        [one] = await quota.take_batch([BatchItem(account_id=acc, metric="urls")])
        assert isinstance(one, TakeResult) and one.used == 4
        with pytest.raises(LinesExceededError):
            async with quota.slot(acc, lines={"seats": 1}):
                pass
        try:
            async with quota.slot(acc, lines={"urls": 2, "exports": 1}):
                raise RuntimeError("boom")
        except RuntimeError:
            pass
        assert (await quota.usage(acc, "urls")).used == 4
        assert not isinstance(one, ApiError)
