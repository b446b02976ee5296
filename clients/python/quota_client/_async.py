"""AsyncQuotaClient: the operations of `_core` driven over an asyncio httpx client."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterable
from types import TracebackType
from typing import Any, Generic, ParamSpec, TypeVar, overload

import httpx

from quota_client import _core
from quota_client._core import (
    DEFAULT_TIMEOUT,
    Answer,
    Call,
    Exchange,
    H,
    Holding,
    Lines,
    OnReleaseError,
    Outcome,
    RetryPolicy,
)
from quota_client.errors import ApiError
from quota_client.models import (
    Account,
    BatchItem,
    FeatureCheck,
    Grant,
    MetricCheck,
    MetricLimit,
    ReleaseResult,
    TakeLinesResult,
    TakeResult,
    Usage,
)

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

_giving_back: set[asyncio.Future[None]] = set()  # slots' releases in flight, shielded from cancellation


class AsyncQuotaClient:
    """`QuotaClient` for asyncio: the same methods, awaited, and `async with client.slot(...)`.
    Backoff waits with asyncio.sleep. Use it with `async with` or call `aclose()`."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        retries: int = RetryPolicy.retries,
        backoff: float = RetryPolicy.backoff,
        max_backoff: float = RetryPolicy.max_backoff,
        on_release_error: OnReleaseError = _core.log_release_error,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._ops = _core.Operations(RetryPolicy(retries=retries, backoff=backoff, max_backoff=max_backoff))
        self._on_release_error = on_release_error
        self._http = httpx.AsyncClient(
            base_url=base_url,
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout,
            transport=transport,
        )

    async def __aenter__(self) -> AsyncQuotaClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def account(self, account_id: str) -> Account:
        return await self._run(self._ops.account(account_id))

    async def ensure_account(
        self, account_id: str, *, kind: str = "user", stripe_customer_id: str | None = None
    ) -> Account:
        return await self._run(
            self._ops.ensure_account(account_id, kind=kind, stripe_customer_id=stripe_customer_id)
        )

    async def limits(self, account_id: str) -> dict[str, MetricLimit]:
        return await self._run(self._ops.limits(account_id))

    async def grants(self, account_id: str, metric: str | None = None) -> list[Grant]:
        return await self._run(self._ops.grants(account_id, metric))

    async def usage(self, account_id: str, metric: str, period: str | None = None) -> Usage:
        return await self._run(self._ops.usage(account_id, metric, period))

    async def check(self, account_id: str, metric: str, units: int = 1) -> MetricCheck:
        return await self._run(self._ops.check(account_id, metric, units))

    async def check_feature(self, account_id: str, feature: str) -> FeatureCheck:
        return await self._run(self._ops.check_feature(account_id, feature))

    async def feature_enabled(self, account_id: str, feature: str) -> bool:
        return await self._run(self._ops.feature_enabled(account_id, feature))

    async def take(
        self, account_id: str, metric: str, units: int = 1, idempotency_key: str | None = None
    ) -> TakeResult:
        return await self._run(self._ops.take(account_id, metric, units, idempotency_key))

    async def take_lines(
        self, account_id: str, lines: Lines, idempotency_key: str | None = None
    ) -> TakeLinesResult:
        return await self._run(self._ops.take_lines(account_id, lines, idempotency_key))

    async def take_batch(self, items: Iterable[BatchItem]) -> list[TakeResult | ApiError]:
        return await self._run(self._ops.take_batch(items))

    async def release(self, take: TakeResult | int) -> ReleaseResult:
        return await self._run(self._ops.release(take))

    @overload
    def slot(
        self, account_id: str, metric: str, units: int = 1, *, on_release_error: OnReleaseError | None = None
    ) -> AsyncSlot[TakeResult]: ...

    @overload
    def slot(
        self, account_id: str, *, lines: Lines, on_release_error: OnReleaseError | None = None
    ) -> AsyncSlot[TakeLinesResult]: ...

    def slot(
        self,
        account_id: str,
        metric: str | None = None,
        units: int = 1,
        *,
        lines: Lines | None = None,
        on_release_error: OnReleaseError | None = None,
    ) -> AsyncSlot[Any]:
        """`async with client.slot(...)`, or a decorator of coroutine functions; as QuotaClient.slot
        (one metric, or `lines`)."""
        what = _core.holding(account_id, metric, units, lines)
        return AsyncSlot(self, what, on_release_error or self._on_release_error)

    async def _run(self, exchange: Exchange[T]) -> T:
        step = next(exchange)
        while True:
            outcome: Outcome = None
            if isinstance(step, Call):
                outcome = await self._send(step)
            else:
                await asyncio.sleep(step.seconds)
            try:
                step = exchange.send(outcome)
            except StopIteration as done:
                result: T = done.value
                return result

    async def _send(self, call: Call) -> Answer | Exception:
        try:
            r = await self._http.request(call.method, call.path, json=call.json, params=call.params)
        except httpx.TransportError as e:
            return e
        return _core.answer(r.status_code, r.headers, r.content)


class AsyncSlot(Generic[H]):
    """One use of `AsyncQuotaClient.slot`; see `Slot`."""

    def __init__(self, client: AsyncQuotaClient, what: Holding[H], on_release_error: OnReleaseError) -> None:
        self._client, self._on_release_error = client, on_release_error
        self._what: Holding[H] = what
        self._held: H | None = None

    async def __aenter__(self) -> H:
        pending = self._what.pending()
        self._held = None
        try:
            self._held = await self._client._run(self._what.take(self._client._ops, pending))
        except BaseException as error:
            if _core.may_hold(error):
                await self._give_back(self._held or pending)
            raise
        return self._held

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        held, self._held = self._held, None
        if exc is not None and held is not None:
            await self._give_back(held)

    async def _give_back(self, held: H) -> None:
        """The holding's give-back as a task of its own, awaited through asyncio.shield: a
        cancellation (a timeout's included) stops the waiting, not the release."""
        task = asyncio.ensure_future(
            self._client._run(self._what.give_back(self._client._ops, held, self._on_release_error))
        )
        _giving_back.add(task)  # the loop keeps only a weak reference to a task
        task.add_done_callback(_giving_back.discard)
        await asyncio.shield(task)

    def __call__(self, fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        @functools.wraps(fn)
        async def held(*args: P.args, **kwargs: P.kwargs) -> R:
            async with AsyncSlot(self._client, self._what, self._on_release_error):
                return await fn(*args, **kwargs)

        return held
