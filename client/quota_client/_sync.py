"""QuotaClient: the operations of `_core` driven over a blocking httpx client."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from types import TracebackType
from typing import ParamSpec, TypeVar

import httpx

from quota_client import _core
from quota_client._core import DEFAULT_TIMEOUT, Answer, Call, Exchange, OnReleaseError, Outcome, RetryPolicy
from quota_client.models import Account, MetricLimit, ReleaseResult, TakeResult, Usage

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class QuotaClient:
    """A client of the quota ledger service, for a product key. Thread-safe; use it as a context
    manager or call `close()`.

    Failed calls (no answer, timeout, 5xx) are retried `retries` times with capped exponential
    backoff and jitter (`backoff` seconds, doubling, at most `max_backoff`); a 4xx answer never is.
    `transport` replaces the network (tests, proxies); `on_release_error` is the default of `slot`.
    """

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
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._ops = _core.Operations(RetryPolicy(retries=retries, backoff=backoff, max_backoff=max_backoff))
        self._on_release_error = on_release_error
        self._http = httpx.Client(
            base_url=base_url,
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout,
            transport=transport,
        )

    def __enter__(self) -> QuotaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def account(self, account_id: str) -> Account:
        """The account, its plan and per metric its effective limit and usage. UnknownAccountError."""
        return self._run(self._ops.account(account_id))

    def ensure_account(
        self, account_id: str, *, kind: str = "user", stripe_customer_id: str | None = None
    ) -> Account:
        """Create the account (kind "user" or "team") or update an existing one; AccountDeletedError
        for a deleted one."""
        return self._run(
            self._ops.ensure_account(account_id, kind=kind, stripe_customer_id=stripe_customer_id)
        )

    def limits(self, account_id: str) -> dict[str, MetricLimit]:
        """Per metric: effective limit (None = unlimited), its source, used, remaining, period."""
        return self._run(self._ops.limits(account_id))

    def usage(self, account_id: str, metric: str, period: str | None = None) -> Usage:
        """Units of `metric` used in `period` (YYYY-MM; default the current month)."""
        return self._run(self._ops.usage(account_id, metric, period))

    def take(
        self, account_id: str, metric: str, units: int = 1, idempotency_key: str | None = None
    ) -> TakeResult:
        """Take `units` now. An exhausted quota is a result with `granted=False`, not an exception;
        UnknownAccountError, AccountDeletedError, ValidationError (e.g. unknown metric) are raised.
        Retries reuse one idempotency key (`idempotency_key`, or one made here), so a take counts
        once however many attempts it needed."""
        return self._run(self._ops.take(account_id, metric, units, idempotency_key))

    def release(self, take: TakeResult | int) -> ReleaseResult:
        """Give a take's units back (a granted TakeResult or its take_id). Safe to repeat."""
        return self._run(self._ops.release(take))

    def slot(
        self, account_id: str, metric: str, units: int = 1, *, on_release_error: OnReleaseError | None = None
    ) -> Slot:
        """Take before a block (or a decorated function) and give back if it raises:

            with client.slot("acc-1", "urls"):
                shorten(url)

        Refused: QuotaExceededError, and the block does not run. The block raised: the take is
        released and the block's exception propagates unchanged; a failed release goes to
        `on_release_error` (default: the client's, which logs at WARNING), never in its place."""
        return Slot(self, account_id, metric, units, on_release_error or self._on_release_error)

    def _run(self, exchange: Exchange[T]) -> T:
        step = next(exchange)
        while True:
            outcome: Outcome = None
            if isinstance(step, Call):
                outcome = self._send(step)
            else:
                time.sleep(step.seconds)
            try:
                step = exchange.send(outcome)
            except StopIteration as done:
                result: T = done.value
                return result

    def _send(self, call: Call) -> Answer | Exception:
        try:
            r = self._http.request(call.method, call.path, json=call.json, params=call.params)
        except httpx.TransportError as e:
            return e
        return _core.answer(r.status_code, r.headers, r.content)


class Slot:
    """One use of `QuotaClient.slot`: a context manager that yields the granted take, or a
    decorator that holds a slot for each call. One `with` at a time per Slot object."""

    def __init__(
        self, client: QuotaClient, account_id: str, metric: str, units: int, on_release_error: OnReleaseError
    ) -> None:
        self._client, self._account_id, self._metric, self._units = client, account_id, metric, units
        self._on_release_error = on_release_error
        self._take: TakeResult | None = None

    def __enter__(self) -> TakeResult:
        take = self._client.take(self._account_id, self._metric, self._units)
        self._take = _core.granted_or_raise(take)
        return self._take

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        take, self._take = self._take, None
        if exc is None or take is None:
            return
        try:
            self._client.release(take)
        except Exception as error:
            _core.report_release_error(self._on_release_error, error, take)
        # Returning None lets `exc` propagate as it was raised.

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def held(*args: P.args, **kwargs: P.kwargs) -> R:
            # A fresh Slot per call, so that concurrent calls of the function hold one take each.
            with Slot(self._client, self._account_id, self._metric, self._units, self._on_release_error):
                return fn(*args, **kwargs)

        return held
