"""What the service answers, as frozen dataclasses. Parsers read the fields they know and ignore the
rest, so a service that adds fields does not break an older client."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True, kw_only=True)
class TakeResult:
    """The outcome of a take. Granted: `take_id` names it (pass the result to `release`). Refused
    because the quota is exhausted: `granted` is false, `reason` is "exhausted", `take_id` is None
    and the numbers say how far it is. `limit` None = unlimited; `period` None for an allocation;
    `replayed` is true when the idempotency key returned an earlier take (nothing moved this time).
    A slot that cannot give back a take it never learned the id of hands `on_release_error` an
    unconfirmed one: `granted`, `take_id` None, no numbers; a take with its `idempotency_key` (same
    metric and units) returns the take, which can then be released."""

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
    from_credits: int = 0  # of `units`, those drawn from grants (credits) after the plan's allowance


@dataclass(frozen=True, kw_only=True)
class Grant:
    """A grant of credits: `units` of `metric` on top of the plan, drawn after the allowance (soonest
    `expires_at` first, None last). `remaining` is what is left now (0 once it ended); `status` is
    "live", "used", "expired" or "voided"; `source` "admin", "stripe" or "revenuecat"."""

    grant_id: int
    metric: str
    units: int
    remaining: int
    expires_at: str | None
    source: str
    status: str
    created_at: str
    note: str | None = None
    voided_at: str | None = None


@dataclass(frozen=True, kw_only=True)
class LineShortfall:
    """A line of a refused multi-line take that did not fit: its counter's `limit` (None = unlimited)
    and what `remaining` of it."""

    metric: str
    units: int
    remaining: int | None
    limit: int | None


@dataclass(frozen=True, kw_only=True)
class TakeLinesResult:
    """The outcome of a multi-line take: every line or none. Granted: `takes` holds one TakeResult per
    line, in the order given (each released on its own). Refused because a quota is exhausted:
    `granted` false, `reason` "exhausted", `takes` empty and `short` every line that did not fit.
    `replayed`: the idempotency key returned the original takes. `lines` are the lines asked for,
    (metric, units). A slot that never learned the takes' ids hands `on_release_error` one
    unconfirmed TakeResult per line, keyed with this `idempotency_key`: `take_lines` with the same
    key and lines returns the takes."""

    granted: bool
    account_id: str
    lines: tuple[tuple[str, int], ...]
    takes: tuple[TakeResult, ...]
    idempotency_key: str
    short: tuple[LineShortfall, ...] = ()
    reason: Literal["exhausted"] | None = None
    replayed: bool = False


@dataclass(frozen=True, kw_only=True)
class BatchItem:
    """One take of `take_batch`: what `take` takes, for any account."""

    account_id: str
    metric: str
    units: int = 1
    idempotency_key: str | None = None


@dataclass(frozen=True, kw_only=True)
class ReleaseResult:
    """The outcome of a release. `released` false says why in `reason`: "already_released" (also
    what a retried release whose first answer was lost gets: the units are back either way) or
    "period_closed" (a take of a consumable from an earlier period, month or day, which its reset
    already cleared; an allocation's take is never closed). `period` is None for an allocation."""

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
    """One metric of an account now: its effective limit (None = unlimited), the rule that set it
    (`override`, `free_fallback` or `plan`) and its usage. `kind` is "consumable" (used up, then zeroed
    when its period ends: `reset` "month" or "day", UTC) or "allocation" (held until released, such
    as seats: `reset`, `period` and `resets_at` None). `over_limit`: `used` is above `limit` (after a
    downgrade or a lower override); takes are refused until releases bring it under."""

    limit: int | None
    limit_source: str
    used: int
    remaining: int | None
    period: str | None
    resets_at: str | None
    kind: str = "consumable"
    reset: str | None = "month"
    over_limit: bool = False
    credits: int = 0  # what the live grants have left; `remaining` counts them


@dataclass(frozen=True, kw_only=True)
class FeatureState:
    """One boolean feature of an account and the rule that decided it: `override` (an admin's),
    `free_fallback` (a lapsed paid plan has the free plan's features) or `plan`."""

    enabled: bool
    source: str


@dataclass(frozen=True, kw_only=True)
class Account:
    id: str
    kind: str
    plan: str
    subscription_status: str
    deleted: bool = False
    limits: dict[str, MetricLimit] = field(default_factory=dict)
    features: dict[str, FeatureState] = field(default_factory=dict)  # every feature any plan names


@dataclass(frozen=True, kw_only=True)
class Usage:
    """Units of `metric` used in `period`; an allocation's is what is held now, `period` None."""

    metric: str
    period: str | None
    used: int


@dataclass(frozen=True, kw_only=True)
class MetricCheck:
    """Whether a take of `units` of `metric` would be granted now (`allowed`), and the counter it
    would move, as a take's numbers. Only a take enforces a limit: another take or a release can
    change the answer before its caller acts, so take all the same and handle a refusal."""

    allowed: bool
    metric: str
    units: int
    limit: int | None
    used: int
    remaining: int | None
    limit_source: str
    period: str | None
    resets_at: str | None


@dataclass(frozen=True, kw_only=True)
class FeatureCheck:
    """Whether the account has `feature` now (`allowed`), and the rule that decided it (`source`)."""

    allowed: bool
    feature: str
    source: str


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
        from_credits=int(body.get("from_credits", 0)),
    )


def grant(body: dict[str, Any]) -> Grant:
    return Grant(
        grant_id=int(body["grant_id"]),
        metric=body["metric"],
        units=int(body["units"]),
        remaining=int(body["remaining"]),
        expires_at=body.get("expires_at"),
        source=body["source"],
        status=body["status"],
        created_at=body["created_at"],
        note=body.get("note"),
        voided_at=body.get("voided_at"),
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


def take_lines_result(
    body: dict[str, Any],
    *,
    account_id: str,
    lines: tuple[tuple[str, int], ...],
    idempotency_key: str,
    replayed: bool,
) -> TakeLinesResult:
    takes = tuple(
        take_result(t, account_id=account_id, units=units, idempotency_key=idempotency_key, replayed=replayed)
        for t, (_, units) in zip(body["takes"], lines, strict=True)
    )
    return TakeLinesResult(
        granted=True,
        account_id=account_id,
        lines=lines,
        takes=takes,
        idempotency_key=idempotency_key,
        replayed=replayed,
    )


def refused_lines(
    body: dict[str, Any], *, account_id: str, lines: tuple[tuple[str, int], ...], idempotency_key: str
) -> TakeLinesResult:
    return TakeLinesResult(
        granted=False,
        reason="exhausted",
        account_id=account_id,
        lines=lines,
        takes=(),
        short=tuple(
            LineShortfall(
                metric=line["metric"],
                units=int(line["units"]),
                remaining=_int_or_none(line.get("remaining")),
                limit=_int_or_none(line.get("limit")),
            )
            for line in body.get("lines") or []
        ),
        idempotency_key=idempotency_key,
    )


def unconfirmed_lines(
    *, account_id: str, lines: tuple[tuple[str, int], ...], idempotency_key: str
) -> TakeLinesResult:
    """A multi-line take sent whose answer never arrived: granted for all the client knows, each line
    an unconfirmed take (no `take_id`); `take_lines` with the same key and lines returns them."""
    return TakeLinesResult(
        granted=True,
        account_id=account_id,
        lines=lines,
        takes=tuple(
            unconfirmed_take(account_id=account_id, metric=m, units=u, idempotency_key=idempotency_key)
            for m, u in lines
        ),
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
    limit, used = _int_or_none(body.get("limit")), int(body["used"])
    return MetricLimit(
        limit=limit,
        limit_source=body["limit_source"],
        used=used,
        remaining=_int_or_none(body.get("remaining")),
        period=body.get("period"),
        resets_at=body.get("resets_at"),
        # A service from before metric kinds had monthly consumables only, and no over_limit.
        kind=body.get("kind", "consumable"),
        reset=body.get("reset", "month"),
        over_limit=bool(body.get("over_limit", limit is not None and used > limit)),
        credits=int(body.get("credits", 0)),
    )


def feature_state(body: dict[str, Any]) -> FeatureState:
    return FeatureState(enabled=bool(body["enabled"]), source=body["source"])


def account(body: dict[str, Any]) -> Account:
    return Account(
        id=body["id"],
        kind=body["kind"],
        plan=body["plan"],
        subscription_status=body["subscription_status"],
        deleted=bool(body.get("deleted", False)),
        limits={metric: metric_limit(m) for metric, m in (body.get("limits") or {}).items()},
        features={name: feature_state(f) for name, f in (body.get("features") or {}).items()},
    )


def usage(body: dict[str, Any]) -> Usage:
    return Usage(metric=body["metric"], period=body.get("period"), used=int(body["used"]))


def metric_check(body: dict[str, Any]) -> MetricCheck:
    return MetricCheck(
        allowed=bool(body["allowed"]),
        metric=body["metric"],
        units=int(body["units"]),
        limit=_int_or_none(body.get("limit")),
        used=int(body["used"]),
        remaining=_int_or_none(body.get("remaining")),
        limit_source=body["limit_source"],
        period=body.get("period"),
        resets_at=body.get("resets_at"),
    )


def feature_check(body: dict[str, Any]) -> FeatureCheck:
    return FeatureCheck(allowed=bool(body["allowed"]), feature=body["feature"], source=body["source"])
