"""The client without I/O: what to send, what an answer means, when to retry and how long to wait.

Every operation is a generator that yields `Call`s (send this) and `Sleep`s (wait this long) and is
sent back each call's outcome: an `Answer`, or the transport's exception. `QuotaClient` and
`AsyncQuotaClient` only drive these generators with their own I/O, so the contract, the retry rule
and the idempotency key live here once for both.
"""

from __future__ import annotations

import json
import logging
import random
import uuid
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx

from quota_client import models
from quota_client.errors import (
    ApiError,
    ConnectionFailedError,
    LinesExceededError,
    QuotaExceededError,
    api_error,
)
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

log = logging.getLogger("quota_client")

T = TypeVar("T")
DEFAULT_TIMEOUT = 5.0  # seconds, for each of connect, write, read and pool wait
OnReleaseError = Callable[[Exception, TakeResult], None]
# The lines of a multi-line take: {metric: units}, or (metric, units) pairs, in the order wanted.
Lines = Mapping[str, int] | Iterable[tuple[str, int]]


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    json: dict[str, Any] | None = None
    params: dict[str, str] | None = None


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any  # the decoded JSON, or None when the body is not JSON (e.g. a proxy's error page)
    retry_after: float | None = None


Step = Call | Sleep
Outcome = Answer | Exception | None
Exchange = Generator[Step, Outcome, T]

# Worth another attempt: the request may not have arrived, or its answer was lost on the way back.
# Anything else a transport raises (a malformed URL, an unsupported scheme) will fail the same way again.
RETRYABLE = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


def answer(status: int, headers: Mapping[str, str], content: bytes) -> Answer:
    try:
        body = json.loads(content) if content else None
    except ValueError:
        body = None
    try:
        retry_after: float | None = float(headers.get("retry-after", ""))
    except ValueError:
        retry_after = None  # absent, or an HTTP date, which no part of this service sends
    return Answer(status, body, retry_after)


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """`retries` more attempts after the first; before attempt n+1 a random wait of up to
    min(`max_backoff`, `backoff` * 2**n) seconds. The jitter spreads the retries of many clients
    that failed together, so that they do not hit a recovering service at the same instant."""

    retries: int = 3
    backoff: float = 0.2
    max_backoff: float = 5.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return max(0.0, min(self.max_backoff, retry_after))
        return random.uniform(0.0, min(self.max_backoff, self.backoff * 2**attempt))


def send(call: Call, policy: RetryPolicy) -> Exchange[Answer]:
    """The call, retried on no answer and on 5xx; any other answer (2xx, 4xx) is final.
    Every call of this API is safe to repeat as it is (takes carry their idempotency key)."""
    attempt = 0
    while True:
        outcome = yield call
        if isinstance(outcome, Answer) and outcome.status < 500:
            return outcome
        last = attempt >= policy.retries
        if isinstance(outcome, Answer):
            if last:
                return outcome
            retry_after = outcome.retry_after
        else:
            if last or not isinstance(outcome, RETRYABLE):
                raise ConnectionFailedError(
                    f"{call.method} {call.path}: no answer after {attempt + 1} attempt(s): {outcome!r}"
                ) from outcome
            retry_after = None
        log.debug("%s %s: attempt %d failed (%r), retrying", call.method, call.path, attempt + 1, outcome)
        yield Sleep(policy.delay(attempt, retry_after))
        attempt += 1


def segment(value: str) -> str:
    """A path segment: percent-encoded, and "." / ".." (valid account ids) spelled so that no URL
    normalisation on the way can read them as "this" or "the parent" directory."""
    if value in (".", ".."):
        return value.replace(".", "%2E")
    return quote(value, safe="")


def ok(answer: Answer) -> dict[str, Any]:
    if 200 <= answer.status < 300 and isinstance(answer.body, dict):
        return answer.body
    if 200 <= answer.status < 300:
        raise ApiError(answer.status, "invalid_response", "the answer is not a JSON object")
    raise api_error(answer.status, answer.body)


def new_idempotency_key() -> str:
    return f"qc-{uuid.uuid4().hex}"


def take_id_of(take: TakeResult | int) -> int:
    if isinstance(take, TakeResult):
        if not take.granted:
            raise ValueError("this take was refused; there is nothing to release")
        if take.take_id is None:
            raise ValueError(
                "this take was never confirmed; take again with its idempotency_key to learn its take_id"
            )
        return take.take_id
    return take


def check_path(account_id: str) -> str:
    """The check of a metric (`metric`, `units`) or of a feature (`feature`): one route, two queries."""
    return f"/v1/accounts/{segment(account_id)}/check"


def release_path(take: TakeResult | int) -> str:
    """A take result knows its account, so its release names it: the service finds the take on that
    account's own shard (on Citus) without a look-up. A bare take id uses the route without it."""
    take_id = take_id_of(take)
    if isinstance(take, TakeResult):
        return f"/v1/accounts/{segment(take.account_id)}/takes/{take_id}/release"
    return f"/v1/takes/{take_id}/release"


class Operations:
    """The API's operations as exchanges, under one retry policy."""

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy

    def account(self, account_id: str) -> Exchange[Account]:
        got = yield from send(Call("GET", f"/v1/accounts/{segment(account_id)}"), self.policy)
        return models.account(ok(got))

    def ensure_account(
        self, account_id: str, *, kind: str, stripe_customer_id: str | None = None
    ) -> Exchange[Account]:
        body: dict[str, Any] = {"kind": kind}
        if stripe_customer_id is not None:
            body["stripe_customer_id"] = stripe_customer_id
        got = yield from send(Call("PUT", f"/v1/accounts/{segment(account_id)}", json=body), self.policy)
        return models.account(ok(got))

    def limits(self, account_id: str) -> Exchange[dict[str, MetricLimit]]:
        account = yield from self.account(account_id)
        return account.limits

    def grants(self, account_id: str, metric: str | None = None) -> Exchange[list[Grant]]:
        params = {} if metric is None else {"metric": metric}
        call = Call("GET", f"/v1/accounts/{segment(account_id)}/grants", params=params)
        got = yield from send(call, self.policy)
        return [models.grant(g) for g in ok(got)["grants"]]

    def usage(self, account_id: str, metric: str, period: str | None = None) -> Exchange[Usage]:
        params = {"metric": metric} if period is None else {"metric": metric, "period": period}
        call = Call("GET", f"/v1/accounts/{segment(account_id)}/usage", params=params)
        got = yield from send(call, self.policy)
        return models.usage(ok(got))

    def check(self, account_id: str, metric: str, units: int = 1) -> Exchange[MetricCheck]:
        params = {"metric": metric, "units": str(units)}
        got = yield from send(Call("GET", check_path(account_id), params=params), self.policy)
        return models.metric_check(ok(got))

    def check_feature(self, account_id: str, feature: str) -> Exchange[FeatureCheck]:
        got = yield from send(Call("GET", check_path(account_id), params={"feature": feature}), self.policy)
        return models.feature_check(ok(got))

    def feature_enabled(self, account_id: str, feature: str) -> Exchange[bool]:
        checked = yield from self.check_feature(account_id, feature)
        return checked.allowed

    def take(
        self, account_id: str, metric: str, units: int = 1, idempotency_key: str | None = None
    ) -> Exchange[TakeResult]:
        # The key is made once, before the first attempt: a retry whose first answer was lost then
        # gets the original take back (200) instead of taking again.
        key = new_idempotency_key() if idempotency_key is None else idempotency_key
        body = {"metric": metric, "units": units, "idempotency_key": key}
        call = Call("POST", f"/v1/accounts/{segment(account_id)}/takes", json=body)
        got = yield from send(call, self.policy)
        if got.status == 409 and isinstance(got.body, dict) and got.body.get("error") == "quota_exhausted":
            return models.refused_take(
                got.body, account_id=account_id, metric=metric, units=units, idempotency_key=key
            )
        return models.take_result(
            ok(got), account_id=account_id, units=units, idempotency_key=key, replayed=got.status == 200
        )

    def take_lines(
        self, account_id: str, lines: Lines, idempotency_key: str | None = None
    ) -> Exchange[TakeLinesResult]:
        key = new_idempotency_key() if idempotency_key is None else idempotency_key
        asked = line_pairs(lines)
        body = {"lines": [{"metric": m, "units": u} for m, u in asked], "idempotency_key": key}
        call = Call("POST", f"/v1/accounts/{segment(account_id)}/takes", json=body)
        got = yield from send(call, self.policy)
        if got.status == 409 and isinstance(got.body, dict) and got.body.get("error") == "quota_exhausted":
            return models.refused_lines(got.body, account_id=account_id, lines=asked, idempotency_key=key)
        return models.take_lines_result(
            ok(got), account_id=account_id, lines=asked, idempotency_key=key, replayed=got.status == 200
        )

    def take_batch(self, items: Iterable[BatchItem]) -> Exchange[list[TakeResult | ApiError]]:
        # Each item's key is made once, before the first attempt, as take's: a retried batch whose
        # answer was lost gets each item's original take back instead of taking again.
        keyed = [
            item if item.idempotency_key is not None else replace(item, idempotency_key=new_idempotency_key())
            for item in items
        ]
        body = {"items": [vars(item) for item in keyed]}
        got = yield from send(Call("POST", "/v1/takes/batch", json=body), self.policy)
        results = ok(got).get("results")
        if not isinstance(results, list) or len(results) != len(keyed):
            raise ApiError(got.status, "invalid_response", "the answer has not one result per item")
        return [batch_result(item, result) for item, result in zip(keyed, results, strict=True)]

    def release(self, take: TakeResult | int) -> Exchange[ReleaseResult]:
        got = yield from send(Call("POST", release_path(take)), self.policy)
        return models.release_result(ok(got))

    def give_back(self, take: TakeResult, on_release_error: OnReleaseError) -> Exchange[None]:
        """What a slot does with a take it must not keep: release it, and an unconfirmed take (one
        whose answer never arrived, `take_id` None) first learns its id by taking again with its
        idempotency key, which returns the original take (200), or takes now if the original never
        arrived (then released at once), or is refused. Never raises: a failure goes to
        `on_release_error` with the take as far as it is known."""
        try:
            if take.take_id is None:
                take = yield from self.take(take.account_id, take.metric, take.units, take.idempotency_key)
                if not take.granted:
                    return
            yield from self.release(take)
        except Exception as error:
            report_release_error(on_release_error, error, take)

    def give_back_lines(self, taken: TakeLinesResult, on_release_error: OnReleaseError) -> Exchange[None]:
        """`give_back` of a multi-line take: an unconfirmed one first learns its takes by taking
        again with its key (the original takes, or taken now, or refused); then each line's take is
        released on its own. Never raises: each failure goes to `on_release_error` with its take."""
        if any(t.take_id is None for t in taken.takes):
            try:
                taken = yield from self.take_lines(taken.account_id, taken.lines, taken.idempotency_key)
            except Exception as error:
                for take in taken.takes:
                    report_release_error(on_release_error, error, take)
                return
        for take in taken.takes:
            try:
                yield from self.release(take)
            except Exception as error:
                report_release_error(on_release_error, error, take)


def line_pairs(lines: Lines) -> tuple[tuple[str, int], ...]:
    """The lines as (metric, units) pairs, in order."""
    pairs = lines.items() if isinstance(lines, Mapping) else lines
    return tuple((str(m), int(u)) for m, u in pairs)


def batch_result(item: BatchItem, result: Any) -> TakeResult | ApiError:
    """One item's answer as its single take's: a TakeResult (granted, or refused as exhausted), or
    the error a single take would raise, returned, not raised."""
    if not isinstance(result, dict):
        return ApiError(0, "invalid_response", "an item's result is not a JSON object")
    status = result.get("status")
    body = {k: v for k, v in result.items() if k != "status"}
    key = str(item.idempotency_key)
    if status in (200, 201):
        return models.take_result(
            body, account_id=item.account_id, units=item.units, idempotency_key=key, replayed=status == 200
        )
    if status == 409 and body.get("error") == "quota_exhausted":
        return models.refused_take(
            body, account_id=item.account_id, metric=item.metric, units=item.units, idempotency_key=key
        )
    return api_error(status if isinstance(status, int) else 0, body)


def pending_take(account_id: str, metric: str, units: int) -> TakeResult:
    """A slot's take before it is sent, its idempotency key made: if the answer never arrives, the
    slot gives back what this names (`Operations.give_back`)."""
    return models.unconfirmed_take(
        account_id=account_id, metric=metric, units=units, idempotency_key=new_idempotency_key()
    )


def pending_lines(account_id: str, lines: tuple[tuple[str, int], ...]) -> TakeLinesResult:
    """A slot's multi-line take before it is sent, its idempotency key made (see `pending_take`)."""
    return models.unconfirmed_lines(account_id=account_id, lines=lines, idempotency_key=new_idempotency_key())


def may_hold(error: BaseException) -> bool:
    """Whether a take that raised `error` may have been granted all the same: an interruption
    (cancellation, KeyboardInterrupt), a lost answer or a 5xx leaves the service's side unknown;
    an answer that refused it (4xx), an exhausted quota or a request that could not be sent at all
    (a malformed URL, which fails the first attempt as every other) does not."""
    if isinstance(error, QuotaExceededError | LinesExceededError):
        return False
    if isinstance(error, ConnectionFailedError) and not isinstance(error.__cause__, RETRYABLE):
        return False
    return not (isinstance(error, ApiError) and error.status < 500)


def granted_or_raise(take: TakeResult) -> TakeResult:
    """What `slot` does with a take: a refusal becomes QuotaExceededError, before the block runs."""
    if not take.granted:
        raise QuotaExceededError(take)
    return take


def lines_granted_or_raise(result: TakeLinesResult) -> TakeLinesResult:
    """What `slot` does with a multi-line take: a refusal becomes LinesExceededError."""
    if not result.granted:
        raise LinesExceededError(result)
    return result


H = TypeVar("H", TakeResult, TakeLinesResult)


class Holding(Generic[H]):
    """What a slot holds while its block runs, for the sync and the async slot alike: how to name it
    before it is sent (`pending`, its idempotency key made), take it (granted, or raise the
    refusal), and give it back."""

    def pending(self) -> H:
        raise NotImplementedError

    def take(self, ops: Operations, pending: H) -> Exchange[H]:
        raise NotImplementedError

    def give_back(self, ops: Operations, held: H, on_release_error: OnReleaseError) -> Exchange[None]:
        raise NotImplementedError


@dataclass(frozen=True)
class OneTake(Holding[TakeResult]):
    account_id: str
    metric: str
    units: int

    def pending(self) -> TakeResult:
        return pending_take(self.account_id, self.metric, self.units)

    def take(self, ops: Operations, pending: TakeResult) -> Exchange[TakeResult]:
        took = yield from ops.take(self.account_id, self.metric, self.units, pending.idempotency_key)
        return granted_or_raise(took)

    def give_back(
        self, ops: Operations, held: TakeResult, on_release_error: OnReleaseError
    ) -> Exchange[None]:
        yield from ops.give_back(held, on_release_error)


@dataclass(frozen=True)
class LineTakes(Holding[TakeLinesResult]):
    account_id: str
    lines: tuple[tuple[str, int], ...]

    def pending(self) -> TakeLinesResult:
        return pending_lines(self.account_id, self.lines)

    def take(self, ops: Operations, pending: TakeLinesResult) -> Exchange[TakeLinesResult]:
        took = yield from ops.take_lines(self.account_id, self.lines, pending.idempotency_key)
        return lines_granted_or_raise(took)

    def give_back(
        self, ops: Operations, held: TakeLinesResult, on_release_error: OnReleaseError
    ) -> Exchange[None]:
        yield from ops.give_back_lines(held, on_release_error)


def holding(account_id: str, metric: str | None, units: int, lines: Lines | None) -> OneTake | LineTakes:
    """What `slot` holds: one metric's take, or several lines' (exactly one of the two named)."""
    if (metric is None) == (lines is None):
        raise TypeError("slot() takes a metric, or lines, not both")
    if lines is not None:
        return LineTakes(account_id, line_pairs(lines))
    assert metric is not None
    return OneTake(account_id, metric, units)


def log_release_error(error: Exception, take: TakeResult) -> None:
    """The default `on_release_error`: the units stay taken until their period's reset (an
    allocation's until released), so say which."""
    log.warning(
        "could not release take %s (%s units of %s for %s): %s",
        take.take_id if take.take_id is not None else f"with idempotency key {take.idempotency_key}",
        take.units,
        take.metric,
        take.account_id,
        error,
    )


def report_release_error(callback: OnReleaseError, error: Exception, take: TakeResult) -> None:
    """Hand a failed release to the callback. Called while the block's own exception propagates,
    which must stay the one the caller sees: a failing callback is logged, never raised."""
    try:
        callback(error, take)
    except Exception:
        log.exception("on_release_error failed for take %s", take.take_id)
