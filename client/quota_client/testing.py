"""An in-memory quota service for product services' own unit tests.

    from quota_client.testing import InMemoryQuota

    quota = InMemoryQuota(limits={"urls": 50, "seats": 1})
    quota.ensure_account("acc-1")
    quota.set_limit("acc-1", "urls", 0)
    with pytest.raises(QuotaExceededError):
        with quota.slot("acc-1", "urls"):
            ...

`InMemoryQuota` is a `QuotaClient` (and `AsyncInMemoryQuota` an `AsyncQuotaClient`) whose network is
`InMemoryService`: code typed against the client takes the fake as it is, and every answer goes
through the client's own parsing, errors and `slot`. The service side keeps what the real one
keeps for these calls: accounts, per-metric limits, per-month counters, takes, releases, idempotency
keys, exhaustion, and the same answers and error codes; the client's contract tests run against
both. Not kept: plans and billing, the ledger, authentication (any key is accepted).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
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
PERIOD = re.compile(r"[0-9]{4}-(0[1-9]|1[0-2])")
MAX_UNITS = 2**31 - 1
BASE_URL = "http://quota.in-memory"

Reply = tuple[int, dict[str, Any]]


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


@dataclass
class _Take:
    take_id: int
    account_id: str
    metric: str
    units: int
    period: str
    answer: dict[str, Any] = field(default_factory=dict)  # as first answered; a replay repeats it
    released: bool = False


def current_period() -> str:
    now = datetime.now(UTC)
    return f"{now.year:04d}-{now.month:02d}"


def _resets_at(period: str) -> str:
    year, month = int(period[:4]), int(period[5:])
    return f"{year + month // 12:04d}-{month % 12 + 1:02d}-01T00:00:00Z"


class InMemoryService(httpx.BaseTransport, httpx.AsyncBaseTransport):
    """The service's product API in memory, as an httpx transport. `limits` are every account's
    plan limits per metric (None = unlimited); metrics not named there are unknown, as metrics not
    in the plan config are to the service. `period` fixes the current month (YYYY-MM) for tests of
    a new month; None follows the UTC clock. Thread-safe."""

    def __init__(
        self, limits: Mapping[str, int | None], *, plan: str = "free", period: str | None = None
    ) -> None:
        self.limits = dict(limits)
        self.plan = plan
        self.period = period
        self._lock = threading.Lock()
        self._accounts: dict[str, _Account] = {}
        self._used: dict[tuple[str, str, str], int] = {}
        self._takes: dict[int, _Take] = {}
        self._keys: dict[tuple[str, str], int] = {}
        self._failures: list[int] = []
        self.requests = 0  # every request that arrived, failed ones included

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
                return self._take(account_id, _json_object(content))
            case "POST", ["v1", "takes", take_id, "release"] if take_id.isdigit():
                return self._release(int(take_id))
            case "POST", ["v1", "accounts", account_id, "takes", take_id, "release"] if take_id.isdigit():
                return self._release(int(take_id), account_id=_account_id(account_id))
            case "GET", ["v1", "accounts", account_id, "usage"]:
                return self._usage(account_id, params)
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
        if key is not None and not (isinstance(key, str) and 1 <= len(key) <= 255):
            fields["idempotency_key"] = ["Length must be between 1 and 255."]
        if fields:
            raise _invalid(fields)
        _account_id(account_id)
        assert isinstance(metric, str) and isinstance(units, int)
        self._known_metric(metric)
        if key is not None and (account_id, key) in self._keys:
            earlier = self._takes[self._keys[account_id, key]]
            if (earlier.metric, earlier.units) != (metric, units):
                raise _Refused(
                    409,
                    "idempotency_key_reused",
                    "This idempotency key was already used for a different take on this account.",
                    take_id=earlier.take_id,
                )
            return 200, earlier.answer
        account = self._account(account_id)
        if account.deleted:
            raise _Refused(410, "account_deleted", f"account {account_id!r} was deleted")
        period = self._period()
        limit, source = self._limit(account, metric)
        used = self._used.get((account_id, metric, period), 0)
        if limit is not None and used + units > limit:
            raise _Refused(
                409,
                "quota_exhausted",
                f"{metric}: {units} more would exceed the limit of {limit}",
                used=used,
                limit=limit,
                remaining=max(limit - used, 0),
                period=period,
                limit_source=source,
            )
        self._used[account_id, metric, period] = used + units
        take = _Take(len(self._takes) + 1, account_id, metric, units, period)
        take.answer = {"take_id": take.take_id, **self._counter_json(account_id, metric), "units": units}
        self._takes[take.take_id] = take
        if key is not None:
            self._keys[account_id, key] = take.take_id
        return 201, take.answer

    def _release(self, take_id: int, *, account_id: str | None = None) -> Reply:
        take = self._takes.get(take_id)
        if take is None or (account_id is not None and take.account_id != account_id):
            raise _Refused(404, "unknown_take", f"unknown take {take_id}")
        if take.released:
            return 200, {"released": False, "reason": ALREADY_RELEASED, "take_id": take_id}
        if take.period != self._period():
            return 200, {"released": False, "reason": PERIOD_CLOSED, "take_id": take_id}
        take.released = True
        counter = (take.account_id, take.metric, take.period)
        given = min(take.units, self._used.get(counter, 0))
        self._used[counter] = self._used.get(counter, 0) - given
        counter_now = self._counter_json(take.account_id, take.metric)
        return 200, {"released": True, "take_id": take_id, **counter_now, "units": given}

    def _usage(self, account_id: str, params: dict[str, str]) -> Reply:
        fields = {name: ["Unknown field."] for name in params if name not in ("metric", "period")}
        metric, period = params.get("metric"), params.get("period")
        if metric is None:
            fields["metric"] = ["Missing data for required field."]
        if period is not None and not PERIOD.fullmatch(period):
            fields["period"] = ["a calendar month, YYYY-MM"]
        if fields:
            raise _invalid(fields)
        assert metric is not None
        _account_id(account_id)
        self._known_metric(metric)
        self._account(account_id)
        period = period or self._period()
        return 200, {
            "metric": metric,
            "period": period,
            "used": self._used.get((account_id, metric, period), 0),
        }

    # Helpers, called with the lock held.

    def _known_metric(self, metric: str) -> None:
        if metric not in self.limits:
            raise _Refused(
                422, "unknown_metric", f"unknown metric {metric!r}; known: {', '.join(self.limits)}"
            )

    def _period(self) -> str:
        return self.period or current_period()

    def _account(self, account_id: str) -> _Account:
        account = self._accounts.get(account_id)
        if account is None:
            raise _Refused(404, "unknown_account", f"unknown account {account_id!r}")
        return account

    def _limit(self, account: _Account, metric: str) -> tuple[int | None, str]:
        if metric in account.overrides:
            return account.overrides[metric], OVERRIDE
        return self.limits[metric], PLAN

    def _counter_json(self, account_id: str, metric: str) -> dict[str, Any]:
        period = self._period()
        limit, source = self._limit(self._accounts[account_id], metric)
        used = self._used.get((account_id, metric, period), 0)
        return {
            "metric": metric,
            "used": used,
            "limit": limit,
            "remaining": None if limit is None else max(limit - used, 0),
            "period": period,
            "limit_source": source,
        }

    def _view(self, account_id: str) -> dict[str, Any]:
        account = self._account(account_id)
        limits = {}
        for metric in self.limits:
            counter = self._counter_json(account_id, metric)
            del counter["metric"]
            limits[metric] = {**counter, "resets_at": _resets_at(counter["period"])}
        return {
            "id": account_id,
            "kind": account.kind,
            "plan": self.plan,
            "subscription_status": NO_SUBSCRIPTION,
            "deleted": account.deleted,
            "limits": limits,
        }


def _json_object(content: bytes) -> dict[str, Any]:
    try:
        body = json.loads(content) if content else None
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise _Refused(400, "invalid_json", "the body must be a JSON object")
    return body


def _only(body: dict[str, Any], *names: str) -> None:
    unknown = {name: ["Unknown field."] for name in body if name not in names}
    if unknown:
        raise _invalid(unknown)


def _account_id(value: str) -> str:
    if not ACCOUNT_ID.fullmatch(value):
        raise _invalid({"id": [ACCOUNT_ID_RULE]}, "invalid account id")
    return value


def _service(limits: Mapping[str, int | None] | None, service: InMemoryService | None) -> InMemoryService:
    if service is not None:
        return service
    if limits is None:
        raise TypeError("give the metrics' limits (limits={'urls': 50}) or an InMemoryService")
    return InMemoryService(limits)


class _AdminActions:
    """The service's admin actions on a fake's state, for the sync and the async fake alike."""

    service: InMemoryService

    def set_limit(self, account_id: str, metric: str, limit: int | None) -> None:
        self.service.set_limit(account_id, metric, limit)

    def clear_limit(self, account_id: str, metric: str) -> None:
        self.service.clear_limit(account_id, metric)

    def delete_account(self, account_id: str) -> None:
        self.service.delete_account(account_id)


class InMemoryQuota(_AdminActions, QuotaClient):
    """A QuotaClient over an `InMemoryService` (made from `limits`, or the `service` given, which
    lets a sync and an async fake share one state). Retries as the real client does, without the
    waits (`backoff` 0). Adds the service's admin actions: `set_limit`, `clear_limit`,
    `delete_account`; `service.fail_next()` makes the next calls fail with 503."""

    def __init__(
        self,
        limits: Mapping[str, int | None] | None = None,
        *,
        service: InMemoryService | None = None,
        retries: int = 3,
        backoff: float = 0.0,
        on_release_error: OnReleaseError = log_release_error,
    ) -> None:
        self.service = _service(limits, service)
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
        service: InMemoryService | None = None,
        retries: int = 3,
        backoff: float = 0.0,
        on_release_error: OnReleaseError = log_release_error,
    ) -> None:
        self.service = _service(limits, service)
        super().__init__(
            BASE_URL,
            "in-memory",
            retries=retries,
            backoff=backoff,
            on_release_error=on_release_error,
            transport=self.service,
        )
