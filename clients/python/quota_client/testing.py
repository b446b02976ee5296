"""An in-memory quota service for product services' own unit tests.

    from quota_client.testing import InMemoryQuota

    quota = InMemoryQuota(
        limits={"urls": 50, "seats": 1, "exports": 3},
        metrics={"seats": {"kind": "allocation"}, "exports": {"reset": "day"}},
        features={"sso": False},
    )
    quota.ensure_account("acc-1")
    quota.set_limit("acc-1", "urls", 0)
    with pytest.raises(QuotaExceededError):
        with quota.slot("acc-1", "urls"):
            ...
    quota.set_feature("acc-1", "sso", True)
    assert quota.feature_enabled("acc-1", "sso")

`InMemoryQuota` is a `QuotaClient` (and `AsyncInMemoryQuota` an `AsyncQuotaClient`) whose network is
`InMemoryService`: code typed against the client takes the fake as it is, and every answer goes
through the client's own parsing, errors and `slot`. The service side keeps what the real one
keeps for these calls: accounts, per-metric limits, counters of the three kinds of metric (consumed
monthly, consumed daily, allocations held until released), boolean features and their overrides,
checks, takes (multi-line takes and batches too), releases, idempotency keys, exhaustion, and the
same answers and error codes; the
client's contract tests run against both. Time is the service's `clock`, which a test can set. Not
kept: plans and billing (one plan for every account, so no lapse and no free-plan fallback), the
ledger, admin resets, authentication (any key is accepted).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from quota_client._async import AsyncQuotaClient
from quota_client._core import OnReleaseError, log_release_error
from quota_client._sync import QuotaClient

# The service's words that this fake answers with (service/vocabulary.py), copied because the client
# cannot import the service; tests/client/test_vocabulary.py holds each copy to its original.
ACCOUNT_KINDS = ("user", "team")
ACCOUNT_ID = re.compile(r"[A-Za-z0-9._:@-]{1,128}")
ACCOUNT_ID_RULE = "1-128 characters of [A-Za-z0-9._:@-]"
RELEASE_REASONS = ALREADY_RELEASED, PERIOD_CLOSED = ("already_released", "period_closed")
LIMIT_SOURCES = OVERRIDE, PLAN = ("override", "plan")  # no plans here, so no free_fallback
NO_SUBSCRIPTION = "none"
METRIC_KINDS = CONSUMABLE, ALLOCATION = ("consumable", "allocation")
RESETS = MONTH, DAY = ("month", "day")
USAGE_PERIOD = re.compile(r"[0-9]{4}-(0[1-9]|1[0-2])(-(0[1-9]|[12][0-9]|3[01]))?")
HELD = "held"  # the period of an allocation's counter; the API shows it as null
MAX_UNITS = 2**31 - 1
MAX_LINES = 20  # of a multi-line take
MAX_ITEMS = 1000  # of a batch
LINE_SEPARATOR = "\x1f"  # no idempotency key may contain it (it separates a multi-line take's lines)
BASE_URL = "http://quota.in-memory"

Reply = tuple[int, dict[str, Any]]
Metrics = Mapping[str, Mapping[str, str]]  # plans.toml's [metrics]: {"seats": {"kind": "allocation"}}


class _Refused(Exception):
    def __init__(self, status: int, code: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.reply: Reply = (status, {"error": code, "message": message, **details})


def _invalid(fields: dict[str, list[str]], message: str = "the request is not valid") -> _Refused:
    return _Refused(422, "validation_failed", message, fields=fields)


@dataclass
class _Account:
    kind: str
    deleted: bool = False
    overrides: dict[str, int | None] = field(default_factory=dict)
    feature_overrides: dict[str, bool] = field(default_factory=dict)


@dataclass
class _Take:
    take_id: int
    account_id: str
    metric: str
    units: int
    period: str  # the counter's: a month, a day, or HELD
    answer: dict[str, Any] = field(default_factory=dict)  # as first answered; a replay repeats it
    released: bool = False
    allowance: int = 0  # of `units`, the plan allowance's share; the rest came from `draws`
    draws: list[tuple[_Grant, int]] = field(default_factory=list)


@dataclass
class _Grant:
    """A grant of credits, as the service keeps it (README "Credits")."""

    grant_id: int
    account_id: str
    metric: str
    units: int
    remaining: int
    expires_at: datetime | None
    created_at: datetime
    voided: bool = False

    def live(self, now: datetime) -> bool:
        return not self.voided and (self.expires_at is None or self.expires_at > now)


@dataclass(frozen=True)
class _Metric:
    """How a metric's counter moves, as plans.toml [metrics] says: `reset` None for an allocation."""

    kind: str = CONSUMABLE
    reset: str | None = MONTH

    def period_at(self, at: datetime) -> str:
        if self.reset is None:
            return HELD
        return at.strftime("%Y-%m-%d" if self.reset == DAY else "%Y-%m")


def _metric_kinds(limits: Mapping[str, object], metrics: Metrics) -> dict[str, _Metric]:
    """The [metrics] table of a plan file, refused as the service refuses it (ValueError naming the key)."""
    kinds: dict[str, _Metric] = {}
    for name, item in metrics.items():
        if name not in limits:
            raise ValueError(f"metrics.{name}: no limit names this metric")
        for key in item:
            if key not in ("kind", "reset"):
                raise ValueError(f"metrics.{name}.{key}: unknown key; known: kind, reset")
        kind = item.get("kind", CONSUMABLE)
        if kind not in METRIC_KINDS:
            raise ValueError(f"metrics.{name}.kind: {kind!r}; one of {', '.join(METRIC_KINDS)}")
        if kind == ALLOCATION and "reset" in item:
            raise ValueError(f"metrics.{name}.reset: an allocation is never reset")
        reset = None if kind == ALLOCATION else item.get("reset", MONTH)
        if reset is not None and reset not in RESETS:
            raise ValueError(f"metrics.{name}.reset: {reset!r}; one of {', '.join(RESETS)}")
        kinds[name] = _Metric(kind, reset)
    return kinds


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _resets_at(period: str) -> str | None:
    """When `period` ends (ISO 8601, UTC): the next month's or day's start; None for HELD."""
    if period == HELD:
        return None
    if len(period) == len("YYYY-MM-DD"):
        end = datetime.fromisoformat(period) + timedelta(days=1)
        return end.strftime("%Y-%m-%dT00:00:00Z")
    year, month = int(period[:4]), int(period[5:])
    return f"{year + month // 12:04d}-{month % 12 + 1:02d}-01T00:00:00Z"


def _shown(period: str) -> str | None:
    return None if period == HELD else period


class InMemoryService(httpx.BaseTransport, httpx.AsyncBaseTransport):
    """The service's product API in memory, as an httpx transport. `limits` are every account's
    plan limits per metric (None = unlimited); metrics not named there are unknown, as metrics not
    in the plan config are to the service. `metrics` is plans.toml's [metrics] table: a metric not
    in it is consumed monthly; `{"kind": "allocation"}` is held until released and never reset;
    `{"reset": "day"}` is consumed daily (UTC). `features` names every boolean feature, each with
    whether the plan has it. `clock` is the time (an aware datetime; default the UTC clock): set
    `now` to fix it at an instant, or `period` ("YYYY-MM") at a month's start, to test a new day or
    month. Thread-safe."""

    def __init__(
        self,
        limits: Mapping[str, int | None],
        *,
        metrics: Metrics | None = None,
        features: Mapping[str, bool] | None = None,
        plan: str = "free",
        period: str | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.limits = dict(limits)
        self.kinds = _metric_kinds(self.limits, metrics or {})
        self.features = dict(features or {})
        for name in self.features:
            if name in self.limits:
                raise ValueError(f"features: {name!r} is also a metric; a name is one or the other")
        self.plan = plan
        self.clock: Callable[[], datetime] = clock or _utc_now
        if period is not None:
            self.period = period
        self._lock = threading.Lock()
        self._accounts: dict[str, _Account] = {}
        self._used: dict[tuple[str, str, str], int] = {}
        self._takes: dict[int, _Take] = {}
        # Each key's takes: one single take's, or a multi-line take's, in metric order (as the ledger
        # keys them: the first line holds the key).
        self._keys: dict[tuple[str, str], tuple[int, ...]] = {}
        self._grants: dict[int, _Grant] = {}
        self._failures: list[int] = []
        self.requests = 0  # every request that arrived, failed ones included

    @property
    def now(self) -> datetime:
        """The service's time, in UTC. Setting it stops the clock at that (aware) instant."""
        at = self.clock()
        if at.tzinfo is None:
            raise ValueError("the clock must give an aware datetime (tzinfo=UTC)")
        return at.astimezone(UTC)

    @now.setter
    def now(self, at: datetime) -> None:
        if at.tzinfo is None:
            raise ValueError("give an aware datetime (tzinfo=UTC)")
        self.clock = lambda: at

    @property
    def period(self) -> str:
        """The current month, YYYY-MM. Setting it stops the clock at the month's first instant."""
        return self.now.strftime("%Y-%m")

    @period.setter
    def period(self, month: str) -> None:
        self.now = datetime.strptime(month, "%Y-%m").replace(tzinfo=UTC)

    def fail_next(self, count: int = 1, status: int = 503) -> None:
        """Answer the next `count` requests with `status` and do nothing, as a service that is down
        would: to test retries, and what a failed release does to a slot."""
        with self._lock:
            self._failures.extend([status] * count)

    # What an admin would do through the admin API.

    def set_limit(self, account_id: str, metric: str, limit: int | None) -> None:
        """A sticky override of the account's limit (None = unlimited), as the admin API sets it."""
        if metric not in self.limits:
            raise ValueError(f"unknown metric {metric!r}; known: {', '.join(self.limits)}")
        with self._lock:
            self._admin(account_id).overrides[metric] = limit

    def clear_limit(self, account_id: str, metric: str) -> None:
        with self._lock:
            self._admin(account_id).overrides.pop(metric, None)

    def set_feature(self, account_id: str, feature: str, enabled: bool) -> None:
        """A sticky override of a boolean feature, as the admin API sets it."""
        if feature not in self.features:
            raise ValueError(f"unknown feature {feature!r}; known: {', '.join(self.features) or 'none'}")
        with self._lock:
            self._admin(account_id).feature_overrides[feature] = enabled

    def clear_feature(self, account_id: str, feature: str) -> None:
        with self._lock:
            self._admin(account_id).feature_overrides.pop(feature, None)

    def grant(self, account_id: str, metric: str, units: int, *, expires_at: datetime | None = None) -> int:
        """Credits, as the admin API grants them: `units` of a consumable `metric`, drawn after the
        allowance (soonest `expires_at` first, none last, then oldest). Returns the grant's id."""
        if self.kinds.get(metric, _Metric()).kind != CONSUMABLE or metric not in self.limits:
            raise ValueError(f"{metric!r}: grants are for the consumable metrics of the plan")
        with self._lock:
            self._admin(account_id)
            grant_id = len(self._grants) + 1
            self._grants[grant_id] = _Grant(
                grant_id,
                account_id,
                metric,
                units,
                units,
                expires_at,
                self.now + timedelta(microseconds=grant_id),
            )
            return grant_id

    def void_grant(self, grant_id: int) -> None:
        """Void forward-only: what is left is forfeited; what takes drew stays drawn."""
        with self._lock:
            grant = self._grants[grant_id]
            grant.voided, grant.remaining = True, 0

    def delete_account(self, account_id: str) -> None:
        """Soft delete: takes are refused with 410 from now on."""
        with self._lock:
            self._admin(account_id).deleted = True

    def _admin(self, account_id: str) -> _Account:
        if account_id not in self._accounts:
            raise KeyError(f"unknown account {account_id!r}; create it with ensure_account first")
        return self._accounts[account_id]

    # The transport.

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self._respond(request, request.read())

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return self._respond(request, await request.aread())

    def _respond(self, request: httpx.Request, content: bytes) -> httpx.Response:
        with self._lock:
            self.requests += 1
            if self._failures:
                status = self._failures.pop(0)
                return httpx.Response(status, json={"error": "unavailable", "message": "failing on purpose"})
            try:
                status, body = self._route(
                    request.method, request.url.path, dict(request.url.params), content
                )
            except _Refused as refused:
                status, body = refused.reply
        return httpx.Response(status, json=body)

    def _route(self, method: str, path: str, params: dict[str, str], content: bytes) -> Reply:
        parts = path.strip("/").split("/")
        match method, parts:
            case "PUT", ["v1", "accounts", account_id]:
                return self._put_account(account_id, _json_object(content))
            case "GET", ["v1", "accounts", account_id]:
                return 200, self._view(_account_id(account_id))
            case "POST", ["v1", "accounts", account_id, "takes"]:
                body = _json_object(content)
                if "lines" in body:
                    return self._take_lines(account_id, body)
                return self._take(account_id, body)
            case "POST", ["v1", "takes", "batch"]:
                return self._batch(_json_object(content))
            case "POST", ["v1", "takes", take_id, "release"] if take_id.isdigit():
                return self._release(int(take_id))
            case "POST", ["v1", "accounts", account_id, "takes", take_id, "release"] if take_id.isdigit():
                return self._release(int(take_id), account_id=_account_id(account_id))
            case "GET", ["v1", "accounts", account_id, "grants"]:
                return self._list_grants(_account_id(account_id), params)
            case "GET", ["v1", "accounts", account_id, "usage"]:
                return self._usage(account_id, params)
            case "GET", ["v1", "accounts", account_id, "check"]:
                return self._check(account_id, params)
        raise _Refused(404, "not_found", f"no route {method} {path}")

    # The product API.

    def _put_account(self, account_id: str, body: dict[str, Any]) -> Reply:
        _only(body, "kind", "stripe_customer_id")
        if body.get("kind") not in ACCOUNT_KINDS:
            raise _invalid({"kind": [f"Must be one of: {', '.join(ACCOUNT_KINDS)}."]})
        customer = body.get("stripe_customer_id")
        if customer is not None and not (isinstance(customer, str) and 1 <= len(customer) <= 255):
            raise _invalid({"stripe_customer_id": ["Length must be between 1 and 255."]})
        account = self._accounts.get(_account_id(account_id))
        if account is not None and account.deleted:
            raise _Refused(410, "account_deleted", f"account {account_id!r} was deleted")
        created = account is None
        if account is None:
            self._accounts[account_id] = _Account(kind=body["kind"])
        else:
            account.kind = body["kind"]
        return (201 if created else 200), self._view(account_id)

    def _take(self, account_id: str, body: dict[str, Any]) -> Reply:
        _only(body, "metric", "units", "idempotency_key")
        metric, units, key = body.get("metric"), body.get("units", 1), body.get("idempotency_key")
        fields: dict[str, list[str]] = {}
        if not isinstance(metric, str) or not 1 <= len(metric) <= 64:
            fields["metric"] = ["A string of 1-64 characters is required."]
        if isinstance(units, bool) or not isinstance(units, int) or not 1 <= units <= MAX_UNITS:
            fields["units"] = [f"An integer from 1 to {MAX_UNITS}."]
        _check_key(key, fields)
        if fields:
            raise _invalid(fields)
        _account_id(account_id)
        assert isinstance(metric, str) and isinstance(units, int)
        self._known_metric(metric)
        if key is not None and (account_id, key) in self._keys:
            earlier = self._earlier(account_id, key, [(metric, units)])
            return 200, earlier[0].answer
        account = self._live(account_id)
        period = self._current(metric)
        limit, source = self._limit(account, metric)
        used = self._used.get((account_id, metric, period), 0)
        draws = self._draws(account_id, metric, used, limit, units)
        if draws is None:
            assert limit is not None  # an unlimited counter fits every take
            raise _Refused(
                409,
                "quota_exhausted",
                f"{metric}: {units} more would exceed the limit of {limit}",
                used=used,
                limit=limit,
                remaining=max(limit - used, 0),
                period=_shown(period),
                limit_source=source,
            )
        take = self._record(account_id, metric, units, period, draws)
        if key is not None:
            self._keys[account_id, key] = (take.take_id,)
        return 201, take.answer

    def _take_lines(self, account_id: str, body: dict[str, Any]) -> Reply:
        _only(body, "lines", "idempotency_key")
        lines, key = body.get("lines"), body.get("idempotency_key")
        fields: dict[str, list[str]] = {}
        asked = _lines(lines, fields)
        _check_key(key, fields)
        if fields:
            raise _invalid(fields)
        _account_id(account_id)
        for metric, _ in asked:
            self._known_metric(metric)
        if key is not None and (account_id, key) in self._keys:
            by_metric = {t.metric: t for t in self._earlier(account_id, key, asked)}
            return 200, {"takes": [by_metric[m].answer for m, _ in asked]}
        account = self._live(account_id)
        short = []
        for metric, units in asked:
            limit, _ = self._limit(account, metric)
            used = self._used.get((account_id, metric, self._current(metric)), 0)
            if limit is not None and self._draws(account_id, metric, used, limit, units) is None:
                short.append(
                    {"metric": metric, "units": units, "remaining": max(limit - used, 0), "limit": limit}
                )
        if short:
            message = "; ".join(
                f"{s['metric']}: {s['units']} more would exceed the limit of {s['limit']}" for s in short
            )
            raise _Refused(409, "quota_exhausted", message, lines=short)
        taken = {}
        for metric, units in asked:
            period = self._current(metric)
            limit, _ = self._limit(account, metric)
            draws = self._draws(
                account_id, metric, self._used.get((account_id, metric, period), 0), limit, units
            )
            assert draws is not None  # every line fits: checked above, under the lock
            taken[metric] = self._record(account_id, metric, units, period, draws)
        if key is not None:
            self._keys[account_id, key] = tuple(taken[m].take_id for m in sorted(taken))
        return 201, {"takes": [taken[m].answer for m, _ in asked]}

    def _earlier(self, account_id: str, key: str, asked: list[tuple[str, int]]) -> list[_Take]:
        """The takes of a key used before, if they are what `asked` asks again; else 409 reused."""
        earlier = [self._takes[i] for i in self._keys[account_id, key]]
        if sorted((t.metric, t.units) for t in earlier) != sorted(asked):
            raise _Refused(
                409,
                "idempotency_key_reused",
                "This idempotency key was already used for a different take on this account.",
                take_id=earlier[0].take_id,
            )
        return earlier

    def _batch(self, body: dict[str, Any]) -> Reply:
        _only(body, "items")
        items = body.get("items")
        if not isinstance(items, list) or not 1 <= len(items) <= MAX_ITEMS:
            raise _invalid({"items": [f"A list of 1 to {MAX_ITEMS} objects."]})
        if not all(isinstance(item, dict) for item in items):
            raise _invalid({"items": ["Not a valid mapping type."]})
        results = []
        for item in items:
            try:
                account_id = item.get("account_id")
                if not isinstance(account_id, str):
                    raise _invalid({"account_id": ["Missing data for required field."]})
                status, answer = self._take(account_id, {k: v for k, v in item.items() if k != "account_id"})
            except _Refused as refused:
                status, answer = refused.reply
            results.append({"status": status, **answer})
        return 200, {"results": results}

    def _release(self, take_id: int, *, account_id: str | None = None) -> Reply:
        take = self._takes.get(take_id)
        if take is None or (account_id is not None and take.account_id != account_id):
            raise _Refused(404, "unknown_take", f"unknown take {take_id}")
        if take.released:
            return 200, {"released": False, "reason": ALREADY_RELEASED, "take_id": take_id}
        if take.period != self._current(take.metric):  # an allocation's (HELD) is never closed
            return 200, {"released": False, "reason": PERIOD_CLOSED, "take_id": take_id}
        take.released = True
        counter = (take.account_id, take.metric, take.period)
        given = min(take.allowance, self._used.get(counter, 0))
        self._used[counter] = self._used.get(counter, 0) - given
        for grant, drawn in reversed(take.draws):  # grants first, newest draw first; an ended one forfeits
            if grant.live(self.now):
                grant.remaining += drawn
                given += drawn
        counter_now = self._counter_json(take.account_id, take.metric)
        return 200, {"released": True, "take_id": take_id, **counter_now, "units": given}

    def _usage(self, account_id: str, params: dict[str, str]) -> Reply:
        fields = {name: ["Unknown field."] for name in params if name not in ("metric", "period")}
        metric, period = params.get("metric"), params.get("period")
        if metric is None:
            fields["metric"] = ["Missing data for required field."]
        if period is not None and not USAGE_PERIOD.fullmatch(period):
            fields["period"] = ["a calendar month YYYY-MM, or a day YYYY-MM-DD"]
        if fields:
            raise _invalid(fields)
        assert metric is not None
        _account_id(account_id)
        self._known_metric(metric)
        current = self._current(metric)
        period = period or current
        if len(period) != len(current):  # a month, a day or HELD: the periods of one kind
            raise _invalid(
                {"period": [_PERIOD_OF_KIND[len(current)].format(metric=metric)]},
                "the period is not of the metric's kind",
            )
        self._account(account_id)
        return 200, {
            "metric": metric,
            "period": _shown(period),
            "used": self._used.get((account_id, metric, period), 0),
        }

    def _check(self, account_id: str, params: dict[str, str]) -> Reply:
        fields = {n: ["Unknown field."] for n in params if n not in ("metric", "units", "feature")}
        metric, feature, units_text = params.get("metric"), params.get("feature"), params.get("units")
        for name, value in (("metric", metric), ("feature", feature)):
            if value is not None and not 1 <= len(value) <= 64:
                fields[name] = ["Length must be between 1 and 64."]
        units = 1
        if units_text is not None:
            if units_text.isascii() and units_text.isdigit() and 1 <= int(units_text) <= MAX_UNITS:
                units = int(units_text)
            else:
                fields["units"] = [f"An integer from 1 to {MAX_UNITS}."]
        if (metric is None) == (feature is None):
            fields["_schema"] = ["name either a metric or a feature"]
        elif feature is not None and units_text is not None:
            fields["units"] = ["units applies to a metric"]
        if fields:
            raise _invalid(fields)
        _account_id(account_id)
        if feature is not None:
            self._known_feature(feature)
            enabled, source = self._feature(self._live(account_id), feature)
            return 200, {"allowed": enabled, "feature": feature, "source": source}
        assert metric is not None
        self._known_metric(metric)
        self._live(account_id)
        counter = self._counter_json(account_id, metric)
        limit, used = counter["limit"], counter["used"]
        return 200, {
            **counter,
            "allowed": self._draws(account_id, metric, used, limit, units) is not None,
            "units": units,
            "resets_at": _resets_at(self._current(metric)),
        }

    # Helpers, called with the lock held.

    def _known_metric(self, metric: str) -> None:
        if metric not in self.limits:
            raise _Refused(
                422, "unknown_metric", f"unknown metric {metric!r}; known: {', '.join(self.limits)}"
            )

    def _known_feature(self, feature: str) -> None:
        if feature not in self.features:
            known = ", ".join(self.features) or "none"
            raise _Refused(422, "unknown_feature", f"unknown feature {feature!r}; known: {known}")

    def _current(self, metric: str) -> str:
        """The period a take of `metric` counts in now: this month, today, or HELD."""
        return self.kinds.get(metric, _Metric()).period_at(self.now)

    def _account(self, account_id: str) -> _Account:
        account = self._accounts.get(account_id)
        if account is None:
            raise _Refused(404, "unknown_account", f"unknown account {account_id!r}")
        return account

    def _live(self, account_id: str) -> _Account:
        account = self._account(account_id)
        if account.deleted:
            raise _Refused(410, "account_deleted", f"account {account_id!r} was deleted")
        return account

    def _feature(self, account: _Account, feature: str) -> tuple[bool, str]:
        """The limits' precedence without plans to lapse from: an override, else the plan's."""
        if feature in account.feature_overrides:
            return account.feature_overrides[feature], OVERRIDE
        return self.features[feature], PLAN

    def _limit(self, account: _Account, metric: str) -> tuple[int | None, str]:
        if metric in account.overrides:
            return account.overrides[metric], OVERRIDE
        return self.limits[metric], PLAN

    def _counter_json(self, account_id: str, metric: str) -> dict[str, Any]:
        period = self._current(metric)
        limit, source = self._limit(self._accounts[account_id], metric)
        used = self._used.get((account_id, metric, period), 0)
        return {
            "metric": metric,
            "used": used,
            "limit": limit,
            "remaining": None if limit is None else max(limit - used, 0),
            "period": _shown(period),
            "limit_source": source,
        }

    def _credits(self, account_id: str, metric: str) -> int:
        return sum(g.remaining for g in self._live_grants(account_id, metric))

    def _live_grants(self, account_id: str, metric: str) -> list[_Grant]:
        """The account's live grants of `metric`, in the order a take draws on them."""
        live = [
            g
            for g in self._grants.values()
            if g.account_id == account_id and g.metric == metric and g.remaining > 0 and g.live(self.now)
        ]
        return sorted(live, key=lambda g: (g.expires_at is None, g.expires_at or g.created_at, g.created_at))

    def _draws(
        self, account_id: str, metric: str, used: int, limit: int | None, units: int
    ) -> list[tuple[_Grant, int]] | None:
        """What a take of `units` draws from grants after the allowance ([] : the allowance covers
        it); None: it does not fit even with them."""
        need = 0 if limit is None else units - max(min(units, limit - used), 0)
        draws = []
        for grant in self._live_grants(account_id, metric):
            if need == 0:
                break
            drawn = min(need, grant.remaining)
            draws.append((grant, drawn))
            need -= drawn
        return None if need else draws

    def _record(
        self, account_id: str, metric: str, units: int, period: str, draws: list[tuple[_Grant, int]]
    ) -> _Take:
        from_credits = sum(d for _, d in draws)
        counter = (account_id, metric, period)
        self._used[counter] = self._used.get(counter, 0) + units - from_credits
        for grant, drawn in draws:
            grant.remaining -= drawn
        take = _Take(len(self._takes) + 1, account_id, metric, units, period, allowance=units - from_credits)
        take.draws = draws
        take.answer = {
            "take_id": take.take_id,
            **self._counter_json(account_id, metric),
            "units": units,
            "from_credits": from_credits,
        }
        self._takes[take.take_id] = take
        return take

    def _list_grants(self, account_id: str, params: dict[str, str]) -> Reply:
        fields = {n: ["Unknown field."] for n in params if n != "metric"}
        if fields:
            raise _invalid(fields)
        self._account(account_id)
        metric = params.get("metric")
        if metric is not None:
            self._known_metric(metric)
        grants = [
            g for g in self._grants.values() if g.account_id == account_id and metric in (None, g.metric)
        ]
        listed = []
        for g in sorted(grants, key=lambda g: g.created_at, reverse=True):
            status = (
                "voided"
                if g.voided
                else "expired"
                if not g.live(self.now)
                else "live"
                if g.remaining
                else "used"
            )
            listed.append(
                {
                    "grant_id": g.grant_id,
                    "metric": g.metric,
                    "units": g.units,
                    "remaining": g.remaining if status == "live" else 0,
                    "expires_at": None if g.expires_at is None else g.expires_at.isoformat(),
                    "source": "admin",
                    "status": status,
                    "note": None,
                    "created_at": g.created_at.isoformat(),
                    "voided_at": None,
                }
            )
        return 200, {"grants": listed}

    def _view(self, account_id: str) -> dict[str, Any]:
        account = self._account(account_id)
        limits = {}
        for metric in self.limits:
            counter = self._counter_json(account_id, metric)
            del counter["metric"]
            kind = self.kinds.get(metric, _Metric())
            credits = self._credits(account_id, metric)
            limits[metric] = {
                **counter,
                "credits": credits,
                "remaining": None if counter["limit"] is None else counter["remaining"] + credits,
                "kind": kind.kind,
                "reset": kind.reset,
                "over_limit": counter["limit"] is not None and counter["used"] > counter["limit"],
                "resets_at": _resets_at(self._current(metric)),
            }
        features = {}
        for feature in self.features:
            enabled, source = self._feature(account, feature)
            features[feature] = {"enabled": enabled, "source": source}
        return {
            "id": account_id,
            "kind": account.kind,
            "plan": self.plan,
            "subscription_status": NO_SUBSCRIPTION,
            "deleted": account.deleted,
            "limits": limits,
            "features": features,
        }


# What a usage query must name for a metric whose current period is this long, as the service says.
_PERIOD_OF_KIND = {
    len(HELD): "{metric} is an allocation: it has no period; omit period for what is held now",
    len("YYYY-MM"): "{metric} resets monthly: name a month, YYYY-MM",
    len("YYYY-MM-DD"): "{metric} resets daily: name a day, YYYY-MM-DD",
}


def _json_object(content: bytes) -> dict[str, Any]:
    try:
        body = json.loads(content) if content else None
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise _Refused(400, "invalid_json", "the body must be a JSON object")
    return body


def _check_key(key: Any, fields: dict[str, list[str]]) -> None:
    if key is not None and not (isinstance(key, str) and 1 <= len(key) <= 255):
        fields["idempotency_key"] = ["Length must be between 1 and 255."]
    elif isinstance(key, str) and LINE_SEPARATOR in key:
        fields["idempotency_key"] = ["Must not contain U+001F (it separates a multi-line take's lines)."]


def _lines(lines: Any, fields: dict[str, list[str]]) -> list[tuple[str, int]]:
    """A multi-line take's lines as (metric, units), or their faults in `fields`."""
    if not isinstance(lines, list) or not 1 <= len(lines) <= MAX_LINES:
        fields["lines"] = [f"Length must be between 1 and {MAX_LINES}."]
        return []
    asked = []
    for i, line in enumerate(lines):
        if not isinstance(line, dict) or set(line) - {"metric", "units"}:
            fields[f"lines.{i}"] = ["A line is {metric, units?}."]
            continue
        metric, units = line.get("metric"), line.get("units", 1)
        if not isinstance(metric, str) or not 1 <= len(metric) <= 64:
            fields[f"lines.{i}.metric"] = ["A string of 1-64 characters is required."]
        elif isinstance(units, bool) or not isinstance(units, int) or not 1 <= units <= MAX_UNITS:
            fields[f"lines.{i}.units"] = [f"An integer from 1 to {MAX_UNITS}."]
        else:
            asked.append((metric, units))
    if len({m for m, _ in asked}) < len(asked):
        fields["lines"] = ["each line names a metric of its own"]
    return asked


def _only(body: dict[str, Any], *names: str) -> None:
    unknown = {name: ["Unknown field."] for name in body if name not in names}
    if unknown:
        raise _invalid(unknown)


def _account_id(value: str) -> str:
    if not ACCOUNT_ID.fullmatch(value):
        raise _invalid({"id": [ACCOUNT_ID_RULE]}, "invalid account id")
    return value


def _service(
    limits: Mapping[str, int | None] | None,
    metrics: Metrics | None,
    features: Mapping[str, bool] | None,
    service: InMemoryService | None,
) -> InMemoryService:
    if service is not None:
        if (limits, metrics, features) != (None, None, None):
            raise TypeError("give limits, metrics and features, or an InMemoryService made with them")
        return service
    if limits is None:
        raise TypeError("give the metrics' limits (limits={'urls': 50}) or an InMemoryService")
    return InMemoryService(limits, metrics=metrics, features=features)


class _AdminActions:
    """The service's admin actions on a fake's state, for the sync and the async fake alike."""

    service: InMemoryService

    def set_limit(self, account_id: str, metric: str, limit: int | None) -> None:
        self.service.set_limit(account_id, metric, limit)

    def clear_limit(self, account_id: str, metric: str) -> None:
        self.service.clear_limit(account_id, metric)

    def set_feature(self, account_id: str, feature: str, enabled: bool) -> None:
        self.service.set_feature(account_id, feature, enabled)

    def clear_feature(self, account_id: str, feature: str) -> None:
        self.service.clear_feature(account_id, feature)

    def delete_account(self, account_id: str) -> None:
        self.service.delete_account(account_id)

    def grant(self, account_id: str, metric: str, units: int, *, expires_at: datetime | None = None) -> int:
        return self.service.grant(account_id, metric, units, expires_at=expires_at)

    def void_grant(self, grant_id: int) -> None:
        self.service.void_grant(grant_id)


class InMemoryQuota(_AdminActions, QuotaClient):
    """A QuotaClient over an `InMemoryService` (made from `limits`, or the `service` given, which
    lets a sync and an async fake share one state). Retries as the real client does, without the
    waits (`backoff` 0). `limits`, `metrics` and `features` are `InMemoryService`'s. Adds the
    service's admin actions: `set_limit`, `clear_limit`, `set_feature`, `clear_feature`,
    `delete_account`, `grant` and `void_grant` (credits, drawn after the allowance);
    `service.fail_next()` makes the next calls fail with 503, and `service.now` (or `service.period`)
    moves the clock."""

    def __init__(
        self,
        limits: Mapping[str, int | None] | None = None,
        *,
        metrics: Metrics | None = None,
        features: Mapping[str, bool] | None = None,
        service: InMemoryService | None = None,
        retries: int = 3,
        backoff: float = 0.0,
        on_release_error: OnReleaseError = log_release_error,
    ) -> None:
        self.service = _service(limits, metrics, features, service)
        super().__init__(
            BASE_URL,
            "in-memory",
            retries=retries,
            backoff=backoff,
            on_release_error=on_release_error,
            transport=self.service,
        )


class AsyncInMemoryQuota(_AdminActions, AsyncQuotaClient):
    """An AsyncQuotaClient over an `InMemoryService`; see `InMemoryQuota`."""

    def __init__(
        self,
        limits: Mapping[str, int | None] | None = None,
        *,
        metrics: Metrics | None = None,
        features: Mapping[str, bool] | None = None,
        service: InMemoryService | None = None,
        retries: int = 3,
        backoff: float = 0.0,
        on_release_error: OnReleaseError = log_release_error,
    ) -> None:
        self.service = _service(limits, metrics, features, service)
        super().__init__(
            BASE_URL,
            "in-memory",
            retries=retries,
            backoff=backoff,
            on_release_error=on_release_error,
            transport=self.service,
        )
