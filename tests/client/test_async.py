"""The async twin: AsyncQuotaClient and `async with client.slot(...)`, against the service and
AsyncInMemoryQuota alike."""

from __future__ import annotations

import asyncio

import pytest
from quota_client import QuotaExceededError, ServerError, UnknownAccountError, ValidationError

pytestmark = pytest.mark.anyio


class Boom(Exception):
    pass


@pytest.fixture
async def quota(backend, acc):
    async with backend.async_client() as client:
        await client.ensure_account(acc)
        yield client


async def test_grant_refusal_release(quota, backend, acc):
    backend.set_limit(acc, "urls", 2)
    took = await quota.take(acc, "urls", units=2)
    assert (took.granted, took.used, took.limit, took.remaining) == (True, 2, 2, 0)
    refused = await quota.take(acc, "urls")
    assert (refused.granted, refused.reason, refused.used, refused.remaining) == (False, "exhausted", 2, 0)
    assert (await quota.release(took)).released
    assert (await quota.usage(acc, "urls")).used == 0
    assert (await quota.limits(acc))["urls"].used == 0
    assert (await quota.account(acc)).id == acc
    with pytest.raises(UnknownAccountError):
        await quota.take("nobody", "urls")


async def test_slot_releases_when_the_block_raises_and_reraises_the_original(quota, acc):
    original = Boom("the work failed")
    with pytest.raises(Boom) as e:
        async with quota.slot(acc, "urls") as take:
            assert take.granted and (await quota.usage(acc, "urls")).used == 1
            raise original
    assert e.value is original
    assert (await quota.usage(acc, "urls")).used == 0


async def test_slot_refused_raises_and_skips_the_block(quota, backend, acc):
    backend.set_limit(acc, "urls", 0)
    ran = []
    with pytest.raises(QuotaExceededError) as e:
        async with quota.slot(acc, "urls"):
            ran.append(True)
    assert ran == [] and (e.value.used, e.value.limit, e.value.remaining) == (0, 0, 0)


async def test_slot_as_a_decorator_of_coroutine_functions(quota, backend, acc):
    backend.set_limit(acc, "urls", 1)

    @quota.slot(acc, "urls")
    async def shorten(url: str, fail: bool = False) -> str:
        if fail:
            raise Boom(url)
        return url[:3]

    with pytest.raises(Boom):
        await shorten("x", fail=True)
    assert await shorten("abcdef") == "abc"
    with pytest.raises(QuotaExceededError):
        await shorten("one too many")
    assert (await quota.usage(acc, "urls")).used == 1


async def test_a_failed_release_goes_to_on_release_error_and_the_original_propagates(backend, acc):
    failures = []
    async with backend.async_client(
        retries=0, on_release_error=lambda e, t: failures.append((e, t))
    ) as quota:
        await quota.ensure_account(acc)
        original = Boom()
        with pytest.raises(Boom) as e:
            async with quota.slot(acc, "urls") as take:
                backend.fail_next(1)
                raise original
        assert e.value is original
        [(error, failed_take)] = failures
        assert isinstance(error, ServerError) and error.status == 503 and failed_take == take


async def test_503_is_retried_and_4xx_is_not(quota, backend, acc):
    before = backend.requests
    backend.fail_next(2)
    assert (await quota.take(acc, "urls")).used == 1
    assert backend.requests - before == 3
    before = backend.requests
    with pytest.raises(ValidationError):
        await quota.take(acc, "urls", units=0)
    assert backend.requests - before == 1


async def test_a_cancelled_block_gives_its_take_back(quota, acc):
    started = asyncio.Event()

    async def work():
        async with quota.slot(acc, "urls"):
            started.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(work())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await quota.usage(acc, "urls")).used == 0


async def test_a_slot_whose_take_times_out_gives_it_back(quota, backend, acc):
    """asyncio.timeout around the slot fires while the take's answer is held back: the service
    granted it; the slot finds it by its idempotency key and releases it, shielded."""
    before = (await quota.account(acc)).limits["urls"].used
    backend.stall_next(1)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.5), quota.slot(acc, "urls"):
            pytest.fail("the block ran")
    assert backend.stalled == 1
    assert (await quota.account(acc)).limits["urls"].used == before


async def test_the_give_back_survives_a_second_cancellation(backend, acc):
    async with backend.async_client(timeout=1.0) as quota:
        await quota.ensure_account(acc)
        before = (await quota.account(acc)).limits["urls"].used
        backend.stall_next(2)  # the take's answer, then the first look for it

        async def work():
            async with quota.slot(acc, "urls"):
                pytest.fail("the block ran")

        task = asyncio.create_task(work())
        for stalls in (1, 2):
            assert await eventually(lambda n=stalls: backend.stalled >= n)
            task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

        # The give-back goes on: its retry finds the take and releases it.
        async def given_back() -> bool:
            return (await quota.account(acc)).limits["urls"].used == before

        assert await eventually(given_back)


async def eventually(check, seconds=5.0):
    """Whether `check()` (a function, or a coroutine function) holds within `seconds`."""
    deadline = asyncio.get_running_loop().time() + seconds
    while True:
        held = check()
        if asyncio.iscoroutine(held):
            held = await held
        if held or asyncio.get_running_loop().time() > deadline:
            return held
        await asyncio.sleep(0.01)
