"""What the service answers, as frozen dataclasses. Parsers read the fields they know and ignore the
rest, so a service that adds fields does not break an older client."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True, kw_only=True)
class TakeResult:
    """The outcome of a take. Granted: `take_id` names it (pass the result to `release`). Refused
    because the quota is exhausted: `granted` is false, `reason` is "exhausted", `take_id` is None
    and the numbers say how far it is. `limit` None = unlimited; `replayed` is true when the
    idempotency key returned an earlier take (nothing moved this time). A slot that cannot give
    back a take it never learned the id of hands `on_release_error` an unconfirmed one: `granted`,
    `take_id` None, no numbers; a take with its `idempotency_key` (same metric and units) returns
    the take, which can then be released."""

    granted: bool
    account_id: str
    metric: str
    units: int
    take_id: int | None
    used: int
    limit: int | None
    remaining: int | None
    limit_source: str | None
    period: str | None
    idempotency_key: str
    reason: Literal["exhausted"] | None = None
    replayed: bool = False


@dataclass(frozen=True, kw_only=True)
class ReleaseResult:
    """The outcome of a release. `released` false says why in `reason`: "already_released" (also
    what a retried release whose first answer was lost gets: the units are back either way) or
    "period_closed" (a take from an earlier month, which its reset already cleared)."""

    released: bool
    take_id: int
    reason: str | None = None
    metric: str | None = None
    units: int = 0
    used: int | None = None
    limit: int | None = None
    remaining: int | None = None
    limit_source: str | None = None
    period: str | None = None


@dataclass(frozen=True, kw_only=True)
class MetricLimit:
    """One metric of an account in the current period: its effective limit (None = unlimited), the
    rule that set it (`override`, `free_fallback` or `plan`) and its usage."""

    limit: int | None
    limit_source: str
    used: int
    remaining: int | None
    period: str
    resets_at: str


@dataclass(frozen=True, kw_only=True)
class Account:
    id: str
    kind: str
    plan: str
    subscription_status: str
    deleted: bool = False
    limits: dict[str, MetricLimit] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Usage:
    metric: str
    period: str
    used: int


def _int_or_none(v: Any) -> int | None:
    return None if v is None else int(v)


def take_result(
    body: dict[str, Any], *, account_id: str, units: int, idempotency_key: str, replayed: bool
) -> TakeResult:
    return TakeResult(
        granted=True,
        account_id=account_id,
        metric=body["metric"],
        units=int(body.get("units", units)),
        take_id=int(body["take_id"]),
        used=int(body["used"]),
        limit=_int_or_none(body.get("limit")),
        remaining=_int_or_none(body.get("remaining")),
        limit_source=body.get("limit_source"),
        period=body.get("period"),
        idempotency_key=idempotency_key,
        replayed=replayed,
    )


def refused_take(
    body: dict[str, Any], *, account_id: str, metric: str, units: int, idempotency_key: str
) -> TakeResult:
    return TakeResult(
        granted=False,
        reason="exhausted",
        account_id=account_id,
        metric=metric,
        units=units,
        take_id=None,
        used=int(body["used"]),
        limit=_int_or_none(body.get("limit")),
        remaining=_int_or_none(body.get("remaining")),
        limit_source=body.get("limit_source"),
        period=body.get("period"),
        idempotency_key=idempotency_key,
    )


def unconfirmed_take(*, account_id: str, metric: str, units: int, idempotency_key: str) -> TakeResult:
    """A take that was sent but whose answer never arrived: granted for all the client knows, with
    no `take_id` and no numbers; a take with the same key (and metric and units) returns it."""
    return TakeResult(
        granted=True,
        account_id=account_id,
        metric=metric,
        units=units,
        take_id=None,
        used=0,
        limit=None,
        remaining=None,
        limit_source=None,
        period=None,
        idempotency_key=idempotency_key,
    )


def release_result(body: dict[str, Any]) -> ReleaseResult:
    return ReleaseResult(
        released=bool(body["released"]),
        take_id=int(body["take_id"]),
        reason=body.get("reason"),
        metric=body.get("metric"),
        units=int(body.get("units") or 0),
        used=_int_or_none(body.get("used")),
        limit=_int_or_none(body.get("limit")),
        remaining=_int_or_none(body.get("remaining")),
        limit_source=body.get("limit_source"),
        period=body.get("period"),
    )


def metric_limit(body: dict[str, Any]) -> MetricLimit:
    return MetricLimit(
        limit=_int_or_none(body.get("limit")),
        limit_source=body["limit_source"],
        used=int(body["used"]),
        remaining=_int_or_none(body.get("remaining")),
        period=body["period"],
        resets_at=body["resets_at"],
    )


def account(body: dict[str, Any]) -> Account:
    return Account(
        id=body["id"],
        kind=body["kind"],
        plan=body["plan"],
        subscription_status=body["subscription_status"],
        deleted=bool(body.get("deleted", False)),
        limits={metric: metric_limit(m) for metric, m in (body.get("limits") or {}).items()},
    )


def usage(body: dict[str, Any]) -> Usage:
    return Usage(metric=body["metric"], period=body["period"], used=int(body["used"]))
