"""QuotaClient: the operations of `_core` driven over a blocking httpx client."""

from __future__ import annotations

import contextvars
import functools
import threading
import time
from collections.abc import Callable, Iterable
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
        """Per metric: its kind and reset, effective limit (None = unlimited), its source, used,
        remaining, over_limit, period."""
        return self._run(self._ops.limits(account_id))

    def grants(self, account_id: str, metric: str | None = None) -> list[Grant]:
        """The account's grants (credits) of `metric` (or every metric), live and ended, newest first.
        UnknownAccountError."""
        return self._run(self._ops.grants(account_id, metric))

    def usage(self, account_id: str, metric: str, period: str | None = None) -> Usage:
        """Units of `metric` used in `period`, of the metric's kind: a month (YYYY-MM) or, for a metric
        reset daily, a day (YYYY-MM-DD); default the current one. An allocation has no period: its
        usage is what is held now. A period of another kind is a ValidationError."""
        return self._run(self._ops.usage(account_id, metric, period))

    def check(self, account_id: str, metric: str, units: int = 1) -> MetricCheck:
        """Whether a take of `units` would be granted now, with the counter's numbers; takes nothing.
        Only a take enforces the limit: the answer can be outdated by the time the caller acts.
        UnknownAccountError, AccountDeletedError, ValidationError (e.g. unknown metric)."""
        return self._run(self._ops.check(account_id, metric, units))

    def check_feature(self, account_id: str, feature: str) -> FeatureCheck:
        """Whether the account has the boolean `feature` now, and which rule decided it (`source`).
        ValidationError (code unknown_feature) for a feature no plan names."""
        return self._run(self._ops.check_feature(account_id, feature))

    def feature_enabled(self, account_id: str, feature: str) -> bool:
        """`check_feature(...).allowed`."""
        return self._run(self._ops.feature_enabled(account_id, feature))

    def take(
        self, account_id: str, metric: str, units: int = 1, idempotency_key: str | None = None
    ) -> TakeResult:
        """Take `units` now. An exhausted quota is a result with `granted=False`, not an exception;
        UnknownAccountError, AccountDeletedError, ValidationError (e.g. unknown metric) are raised.
        Retries reuse one idempotency key (`idempotency_key`, or one made here), so a take counts
        once however many attempts it needed."""
        return self._run(self._ops.take(account_id, metric, units, idempotency_key))

    def take_lines(
        self, account_id: str, lines: Lines, idempotency_key: str | None = None
    ) -> TakeLinesResult:
        """Take every line or none: `lines` is {metric: units} (or (metric, units) pairs), 1-20
        distinct metrics of any kinds. Granted: one TakeResult per line, in order, each released on
        its own. An exhausted quota is a result with `granted=False` whose `short` names every line
        that did not fit; nothing was taken. Other refusals are raised as by `take`; retries reuse
        one idempotency key, which a single take may not share (ConflictError)."""
        return self._run(self._ops.take_lines(account_id, lines, idempotency_key))

    def take_batch(self, items: Iterable[BatchItem]) -> list[TakeResult | ApiError]:
        """Many independent takes (1-1000, of any accounts) in one request, not atomic: per item, in
        order, what `take` of it would give: a TakeResult (granted, or refused as exhausted), or the
        error `take` would raise, returned here rather than raised. An item without a key gets one
        made here, so a retried batch counts each item once. A body the service refuses whole (no
        items, more than 1000) raises ValidationError."""
        return self._run(self._ops.take_batch(items))

    def release(self, take: TakeResult | int) -> ReleaseResult:
        """Give a take's units back (a granted TakeResult or its take_id). Safe to repeat."""
        return self._run(self._ops.release(take))

    @overload
    def slot(
        self, account_id: str, metric: str, units: int = 1, *, on_release_error: OnReleaseError | None = None
    ) -> Slot[TakeResult]: ...

    @overload
    def slot(
        self, account_id: str, *, lines: Lines, on_release_error: OnReleaseError | None = None
    ) -> Slot[TakeLinesResult]: ...

    def slot(
        self,
        account_id: str,
        metric: str | None = None,
        units: int = 1,
        *,
        lines: Lines | None = None,
        on_release_error: OnReleaseError | None = None,
    ) -> Slot[Any]:
        """Take before a block (or a decorated function) and give back if it raises:

            with client.slot("acc-1", "urls"):
                shorten(url)

            with client.slot("acc-1", lines={"campaigns": 1, "emails": 5000}):
                send(campaign)

        Refused: QuotaExceededError (several lines: LinesExceededError, naming every line that did
        not fit), and the block does not run. The block raised: the take (each line's) is
        released and the block's exception propagates unchanged; a failed release goes to
        `on_release_error` (default: the client's, which logs at WARNING), never in its place.
        The take itself interrupted (KeyboardInterrupt, a timeout or cancellation, no answer, a
        5xx): the service may have granted it, so the slot finds it by its idempotency key and
        releases it before the exception goes on; if it cannot, `on_release_error` gets the take
        (each line's) with `take_id` None and its key. A second interrupt stops the waiting, not the
        release: the release runs in a thread of its own (in a copy of the caller's contextvars),
        which also calls `on_release_error`."""
        what = _core.holding(account_id, metric, units, lines)
        return Slot(self, what, on_release_error or self._on_release_error)

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


class Slot(Generic[H]):
    """One use of `QuotaClient.slot`: a context manager that yields the granted take (a
    TakeLinesResult for several lines), or a decorator that holds a slot for each call. One `with`
    at a time per Slot object."""

    def __init__(self, client: QuotaClient, what: Holding[H], on_release_error: OnReleaseError) -> None:
        self._client, self._on_release_error = client, on_release_error
        self._what: Holding[H] = what
        self._held: H | None = None

    def __enter__(self) -> H:
        pending = self._what.pending()
        self._held = None
        try:
            self._held = self._client._run(self._what.take(self._client._ops, pending))
        except BaseException as error:
            if _core.may_hold(error):
                self._give_back(self._held or pending)
            raise
        return self._held

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        held, self._held = self._held, None
        if exc is not None and held is not None:
            self._give_back(held)
        # Returning None lets `exc` propagate as it was raised.

    def _give_back(self, held: H) -> None:
        """The holding's give-back in a thread of its own, which this one waits for: a second
        KeyboardInterrupt stops the waiting, not the release (the interpreter waits for the thread
        before it exits). The thread runs in a copy of this thread's context."""
        give_back = self._what.give_back(self._client._ops, held, self._on_release_error)
        context = contextvars.copy_context()
        worker = threading.Thread(
            target=context.run, args=(self._client._run, give_back), name="quota-client-give-back"
        )
        worker.start()
        worker.join()

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def held(*args: P.args, **kwargs: P.kwargs) -> R:
            # A fresh Slot per call, so that concurrent calls of the function hold one take each.
            with Slot(self._client, self._what, self._on_release_error):
                return fn(*args, **kwargs)

        return held
