"""The client's contract, run against the real service and against InMemoryQuota alike: what the
fake promises product tests is what the service does."""

from __future__ import annotations

import dataclasses
import time
from datetime import UTC, datetime, timedelta

import pytest
from quota_client import (
    AccountDeletedError,
    ConflictError,
    NotFoundError,
    QuotaExceededError,
    ServerError,
    TakeResult,
    UnknownAccountError,
    UnknownTakeError,
    ValidationError,
)

from tests.client.conftest import interrupted_when_stalled

PERIOD = datetime.now(UTC).strftime("%Y-%m")


def test_ensure_account_then_its_limits(quota, acc):
    created = quota.ensure_account(acc, kind="team")
    assert (created.id, created.kind, created.deleted) == (acc, "team", False)
    urls = quota.limits(acc)["urls"]
    assert (urls.limit, urls.limit_source, urls.used, urls.remaining, urls.period) == (
        50,
        "plan",
        0,
        50,
        PERIOD,
    )
    assert urls.resets_at.endswith("-01T00:00:00Z")
    assert quota.ensure_account(acc, kind="user").kind == "user"
    assert quota.account(acc).kind == "user"


def test_take_is_granted_with_the_numbers(quota, acc):
    quota.ensure_account(acc)
    first = quota.take(acc, "urls")
    second = quota.take(acc, "urls", units=3)
    assert first.granted and second.granted and not second.replayed
    assert isinstance(first.take_id, int) and second.take_id != first.take_id
    assert (second.used, second.limit, second.remaining, second.limit_source, second.period) == (
        4,
        50,
        46,
        "plan",
        PERIOD,
    )
    assert (second.account_id, second.metric, second.units, second.reason) == (acc, "urls", 3, None)
    assert quota.usage(acc, "urls").used == 4


def test_exhausted_is_a_result_with_the_numbers_and_takes_nothing(quota, backend, acc):
    quota.ensure_account(acc)
    backend.set_limit(acc, "urls", 2)
    assert quota.take(acc, "urls", units=2).granted
    refused = quota.take(acc, "urls")
    assert not refused.granted and refused.reason == "exhausted" and refused.take_id is None
    assert (refused.used, refused.limit, refused.remaining, refused.limit_source) == (2, 2, 0, "override")
    assert refused.period == PERIOD
    assert quota.usage(acc, "urls").used == 2


def test_unlimited_has_no_limit_and_no_remaining(quota, backend, acc):
    quota.ensure_account(acc)
    backend.set_limit(acc, "urls", None)
    took = quota.take(acc, "urls", units=1000)
    assert (took.granted, took.limit, took.remaining, took.used) == (True, None, None, 1000)


def test_same_idempotency_key_returns_the_original_take(quota, acc):
    quota.ensure_account(acc)
    first = quota.take(acc, "urls", units=2, idempotency_key="order-17")
    quota.take(acc, "urls")
    again = quota.take(acc, "urls", units=2, idempotency_key="order-17")
    assert again.replayed and not first.replayed
    assert (again.take_id, again.used, again.idempotency_key) == (first.take_id, 2, "order-17")
    assert quota.usage(acc, "urls").used == 3
    with pytest.raises(ConflictError) as e:
        quota.take(acc, "urls", units=5, idempotency_key="order-17")
    assert (e.value.status, e.value.code) == (409, "idempotency_key_reused")


def test_release_gives_back_once(quota, acc):
    quota.ensure_account(acc)
    took = quota.take(acc, "urls", units=3)
    released = quota.release(took)
    assert (released.released, released.take_id, released.units, released.used) == (True, took.take_id, 3, 0)
    assert (released.limit, released.remaining, released.metric) == (50, 50, "urls")
    again = quota.release(took.take_id)
    assert (again.released, again.reason) == (False, "already_released")
    assert quota.usage(acc, "urls").used == 0


def test_a_take_result_is_released_through_its_own_account(quota, acc):
    """A take result's release names its account (the route a sharded database sends to one
    shard): the same take under another account's name is not found, and is not released."""
    quota.ensure_account(acc)
    quota.ensure_account(acc + "-other")
    took = quota.take(acc, "urls", units=2)
    with pytest.raises(UnknownTakeError):
        quota.release(dataclasses.replace(took, account_id=acc + "-other"))
    assert quota.usage(acc, "urls").used == 2
    assert quota.release(took).released


def test_release_refusals(quota, acc):
    quota.ensure_account(acc)
    with pytest.raises(UnknownTakeError) as e:
        quota.release(987654)
    assert (e.value.status, e.value.code) == (404, "unknown_take")
    refused = TakeResult(
        granted=False, account_id=acc, metric="urls", units=1, take_id=None, used=0, limit=0,
        remaining=0, limit_source="plan", period=PERIOD, idempotency_key="k", reason="exhausted",
    )  # fmt: skip
    with pytest.raises(ValueError, match="refused"):
        quota.release(refused)


def test_unknown_and_deleted_accounts_raise(quota, backend, acc):
    for call in (
        lambda: quota.take("nobody", "urls"),
        lambda: quota.account("nobody"),
        lambda: quota.limits("nobody"),
        lambda: quota.usage("nobody", "urls"),
    ):
        with pytest.raises(UnknownAccountError) as e:
            call()
        assert (e.value.status, e.value.code) == (404, "unknown_account")
    quota.ensure_account(acc)
    kept = quota.take(acc, "urls", idempotency_key="before")
    backend.delete(acc)
    with pytest.raises(AccountDeletedError) as deleted:
        quota.take(acc, "urls")
    assert (deleted.value.status, deleted.value.code) == (410, "account_deleted")
    with pytest.raises(AccountDeletedError):
        quota.ensure_account(acc)
    assert quota.release(kept).released  # what was taken before the delete can still be given back


def test_invalid_requests_raise_validation_errors_with_the_fields(quota, acc):
    quota.ensure_account(acc)
    with pytest.raises(ValidationError) as e:
        quota.take(acc, "bananas")
    assert (e.value.status, e.value.code) == (422, "unknown_metric")
    with pytest.raises(ValidationError) as e:
        quota.take(acc, "urls", units=0)
    assert (e.value.code, set(e.value.fields)) == ("validation_failed", {"units"})
    with pytest.raises(ValidationError) as e:
        quota.take(acc, "urls", idempotency_key="")
    assert set(e.value.fields) == {"idempotency_key"}
    with pytest.raises(ValidationError) as e:
        quota.usage(acc, "urls", period="2024-13")
    assert set(e.value.fields) == {"period"}
    with pytest.raises(ValidationError) as e:
        quota.ensure_account(acc, kind="robot")
    assert set(e.value.fields) == {"kind"}
    with pytest.raises(ValidationError) as e:
        quota.take("bad id", "urls")
    assert set(e.value.fields) == {"id"}
    with pytest.raises(NotFoundError) as e:  # a "/" makes it another path, which no route serves
        quota.take("bad/id", "urls")
    assert e.value.code == "not_found"
    assert quota.usage(acc, "urls").used == 0


def test_account_ids_that_look_like_path_steps(quota):
    for account_id in (".", "..", "a:b@c.d-_"):
        assert quota.ensure_account(account_id).id == account_id
        assert quota.take(account_id, "urls").granted
        assert quota.usage(account_id, "urls").used == 1


def test_usage_of_a_period_without_takes_is_zero(quota, acc):
    quota.ensure_account(acc)
    quota.take(acc, "urls")
    assert quota.usage(acc, "urls", period="2020-01").used == 0
    assert quota.usage(acc, "urls", period=PERIOD).used == 1


def test_slot_keeps_the_take_when_the_block_succeeds(quota, acc):
    quota.ensure_account(acc)
    with quota.slot(acc, "urls", units=2) as take:
        assert take.granted and take.used == 2
    assert quota.usage(acc, "urls").used == 2


def test_slot_refused_raises_with_the_numbers_and_skips_the_block(quota, backend, acc):
    quota.ensure_account(acc)
    backend.set_limit(acc, "urls", 1)
    quota.take(acc, "urls")
    ran = []
    with pytest.raises(QuotaExceededError) as e, quota.slot(acc, "urls"):
        ran.append(True)
    assert ran == []
    assert (e.value.used, e.value.limit, e.value.remaining) == (1, 1, 0)
    assert e.value.take.reason == "exhausted"


class Boom(Exception):
    pass


def test_slot_releases_when_the_block_raises_and_reraises_the_original(quota, acc):
    quota.ensure_account(acc)
    original = Boom("the work failed")
    with pytest.raises(Boom) as e, quota.slot(acc, "urls"):
        assert quota.usage(acc, "urls").used == 1
        raise original
    assert e.value is original
    assert quota.usage(acc, "urls").used == 0


def test_slot_as_a_decorator_holds_a_slot_per_call(quota, backend, acc):
    quota.ensure_account(acc)
    backend.set_limit(acc, "urls", 2)

    @quota.slot(acc, "urls")
    def shorten(url: str, fail: bool = False) -> str:
        if fail:
            raise Boom(url)
        return url[:5]

    assert shorten.__name__ == "shorten"
    assert shorten("https://example.com") == "https"
    with pytest.raises(Boom):
        shorten("x", fail=True)
    assert shorten("again") == "again"
    with pytest.raises(QuotaExceededError):
        shorten("one too many")
    assert quota.usage(acc, "urls").used == 2


def test_a_failed_release_goes_to_on_release_error_and_the_original_propagates(backend, acc):
    failures = []
    with backend.client(
        retries=1, on_release_error=lambda error, take: failures.append((error, take))
    ) as quota:
        quota.ensure_account(acc)
        original = Boom("the work failed")
        with pytest.raises(Boom) as e, quota.slot(acc, "urls") as take:
            backend.fail_next(2)  # the release and its one retry
            raise original
        assert e.value is original
        [(error, failed_take)] = failures
        assert isinstance(error, ServerError) and (error.status, error.code) == (503, "unavailable")
        assert failed_take == take
        assert quota.usage(acc, "urls").used == 1  # not given back: the callback's to handle


def test_the_default_on_release_error_logs_a_warning(backend, caplog, acc):
    with backend.client(retries=0) as quota:
        quota.ensure_account(acc)
        with pytest.raises(Boom), quota.slot(acc, "urls") as take:
            backend.fail_next(1)
            raise Boom
    [record] = [r for r in caplog.records if r.name == "quota_client"]
    assert record.levelname == "WARNING" and f"take {take.take_id}" in record.getMessage()


def test_a_failing_callback_does_not_replace_the_original_either(backend, caplog, acc):
    def callback(error, take):
        raise RuntimeError("the callback broke too")

    with backend.client(retries=0, on_release_error=callback) as quota:
        quota.ensure_account(acc)
        with pytest.raises(Boom), quota.slot(acc, "urls"):
            backend.fail_next(1)
            raise Boom
    assert "on_release_error failed" in caplog.text


def test_503_is_retried_and_the_take_counts_once(backend, acc):
    with backend.client() as quota:
        quota.ensure_account(acc)
        before = backend.requests
        backend.fail_next(2)
        took = quota.take(acc, "urls")
        assert took.granted and took.used == 1
        assert backend.requests - before == 3
        assert quota.usage(acc, "urls").used == 1


def test_retries_give_up_with_the_last_server_error(backend, acc):
    with backend.client(retries=2) as quota:
        quota.ensure_account(acc)
        before = backend.requests
        backend.fail_next(3)
        with pytest.raises(ServerError) as e:
            quota.take(acc, "urls")
        assert e.value.status == 503 and backend.requests - before == 3
        assert quota.usage(acc, "urls").used == 0


def test_4xx_is_never_retried(backend, acc):
    with backend.client(retries=3) as quota:
        quota.ensure_account(acc)
        for call, error in (
            (lambda: quota.take(acc, "bananas"), ValidationError),
            (lambda: quota.take("nobody", "urls"), UnknownAccountError),
            (lambda: quota.release(987654), UnknownTakeError),
        ):
            before = backend.requests
            with pytest.raises(error):
                call()
            assert backend.requests - before == 1


def test_a_slot_interrupted_while_its_take_is_answered_gives_the_take_back(backend, acc):
    """Ctrl-C while the take's answer is on its way: the service granted it, the slot never learned
    its id; the slot finds it by its idempotency key and releases it before the interrupt goes on."""
    with backend.client() as quota:
        quota.ensure_account(acc)
        before = quota.account(acc).limits["urls"].used
        backend.stall_next(1)
        ran = []
        with pytest.raises(KeyboardInterrupt), interrupted_when_stalled(backend), quota.slot(acc, "urls"):
            ran.append(True)
        assert ran == [] and backend.stalled == 1
        assert quota.account(acc).limits["urls"].used == before


def test_a_second_interrupt_stops_the_waiting_not_the_give_back(backend, acc):
    with backend.client(timeout=1.0) as quota:
        quota.ensure_account(acc)
        before = quota.account(acc).limits["urls"].used
        backend.stall_next(2)  # the take's answer, then the first look for it
        with (
            pytest.raises(KeyboardInterrupt),
            interrupted_when_stalled(backend, times=2),
            quota.slot(acc, "urls"),
        ):
            pass
        assert backend.stalled == 2
        # The give-back goes on in its own thread: its retry finds the take and releases it.
        for _ in range(500):
            if quota.account(acc).limits["urls"].used == before:
                break
            time.sleep(0.01)
        assert quota.account(acc).limits["urls"].used == before


def test_an_interrupted_take_that_cannot_be_found_goes_to_on_release_error(backend, acc):
    failures = []
    with backend.client(
        retries=0, on_release_error=lambda error, take: failures.append((error, take))
    ) as quota:
        quota.ensure_account(acc)
        before = quota.account(acc).limits["urls"].used
        backend.stall_next(1)
        # The take's answer is held back, and the service is unavailable when the slot looks for it.
        with (
            pytest.raises(KeyboardInterrupt),
            interrupted_when_stalled(backend, then=lambda: backend.fail_next(1)),
            quota.slot(acc, "urls", units=2),
        ):
            pass
        [(error, take)] = failures
        assert isinstance(error, ServerError) and error.status == 503
        assert (take.account_id, take.metric, take.units, take.take_id) == (acc, "urls", 2, None)
        assert quota.account(acc).limits["urls"].used == before + 2  # held: the callback's to handle
        # What the callback can do about it: the take's key finds it, and then it can be released.
        found = quota.take(acc, "urls", units=2, idempotency_key=take.idempotency_key)
        assert found.replayed and quota.release(found).released
        assert quota.account(acc).limits["urls"].used == before


def test_a_slot_whose_take_was_refused_by_an_answer_sends_nothing_more(backend, acc):
    with backend.client() as quota:
        before = backend.requests
        with pytest.raises(UnknownAccountError), quota.slot("nobody", "urls"):
            pass
        assert backend.requests - before == 1


def test_credits_are_drawn_after_the_allowance_and_given_back_first(quota, backend, acc):
    """Credits (README "Credits"): the take draws the allowance, then the soonest-expiring grant;
    the view counts them; a release gives grants back first; a void is forward-only."""
    quota.ensure_account(acc)
    backend.set_limit(acc, "urls", 2)
    never = backend.grant(acc, "urls", 5)
    soon = backend.grant(acc, "urls", 1, expires_at=datetime.now(UTC) + timedelta(days=3))
    assert quota.limits(acc)["urls"].credits == 6
    assert quota.limits(acc)["urls"].remaining == 8
    take = quota.take(acc, "urls", units=4)
    assert (take.granted, take.units, take.from_credits, take.used, take.remaining) == (True, 4, 2, 2, 0)
    listed = {g.grant_id: (g.remaining, g.status) for g in quota.grants(acc, "urls")}
    assert listed == {never: (4, "live"), soon: (0, "used")}
    backend.void_grant(soon)
    released = quota.release(take)
    assert (released.released, released.units) == (True, 3)  # the voided grant's unit is forfeited
    assert quota.limits(acc)["urls"].credits == 5
    assert not quota.take(acc, "urls", units=8).granted
    assert quota.take(acc, "urls", units=7).from_credits == 5
