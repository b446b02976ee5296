"""AsyncQuotaClient: the operations of `_core` driven over an asyncio httpx client."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import ParamSpec, TypeVar

import httpx

from quota_client import _core
from quota_client._core import DEFAULT_TIMEOUT, Answer, Call, Exchange, OnReleaseError, Outcome, RetryPolicy
from quota_client.models import (
    Account,
    FeatureCheck,
    MetricCheck,
    MetricLimit,
    ReleaseResult,
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

    async def release(self, take: TakeResult | int) -> ReleaseResult:
        return await self._run(self._ops.release(take))

    def slot(
        self, account_id: str, metric: str, units: int = 1, *, on_release_error: OnReleaseError | None = None
    ) -> AsyncSlot:
        """`async with client.slot(...)`, or a decorator of coroutine functions; as QuotaClient.slot."""
        return AsyncSlot(self, account_id, metric, units, on_release_error or self._on_release_error)

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


class AsyncSlot:
    """One use of `AsyncQuotaClient.slot`; see `Slot`."""

    def __init__(
        self,
        client: AsyncQuotaClient,
        account_id: str,
        metric: str,
        units: int,
        on_release_error: OnReleaseError,
    ) -> None:
        self._client, self._account_id, self._metric, self._units = client, account_id, metric, units
        self._on_release_error = on_release_error
        self._take: TakeResult | None = None

    async def __aenter__(self) -> TakeResult:
        pending = _core.pending_take(self._account_id, self._metric, self._units)
        self._take = None
        try:
            self._take = _core.granted_or_raise(
                await self._client.take(self._account_id, self._metric, self._units, pending.idempotency_key)
            )
        except BaseException as error:
            if _core.may_hold(error):
                await self._give_back(self._take or pending)
            raise
        return self._take

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        take, self._take = self._take, None
        if exc is not None and take is not None:
            await self._give_back(take)

    async def _give_back(self, take: TakeResult) -> None:
        """`_core.Operations.give_back` as a task of its own, awaited through asyncio.shield: a
        cancellation (a timeout's included) stops the waiting, not the release."""
        task = asyncio.ensure_future(
            self._client._run(self._client._ops.give_back(take, self._on_release_error))
        )
        _giving_back.add(task)  # the loop keeps only a weak reference to a task
        task.add_done_callback(_giving_back.discard)
        await asyncio.shield(task)

    def __call__(self, fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        @functools.wraps(fn)
        async def held(*args: P.args, **kwargs: P.kwargs) -> R:
            async with AsyncSlot(
                self._client, self._account_id, self._metric, self._units, self._on_release_error
            ):
                return await fn(*args, **kwargs)

        return held
