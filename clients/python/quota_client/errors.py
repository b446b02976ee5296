"""Errors the client raises. Each docstring says what it means; `code` is the service's error code.

A refusal because the quota is exhausted is not here: `take` and `take_lines` return it as a result
(`granted=False`), and only `slot` turns it into `QuotaExceededError` (several lines:
`LinesExceededError`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from quota_client.models import LineShortfall, TakeLinesResult, TakeResult


class QuotaClientError(Exception):
    """Base of every error this client raises."""


class ApiError(QuotaClientError):
    """The service answered with an error: `status`, its `code` and `message`, and any `details`."""

    def __init__(self, status: int, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message
        self.details: dict[str, Any] = details or {}


class AuthError(ApiError):
    """The API key is missing, unknown, revoked or past its rotation grace (401), or its role may not do
    this (403)."""


class ValidationError(ApiError):
    """The service refused the request as invalid (400, 422); `fields` has per-field messages."""

    @property
    def fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = self.details.get("fields") or {}
        return fields


class NotFoundError(ApiError):
    """The service knows no such thing (404)."""


class UnknownAccountError(NotFoundError):
    """No account has this id (create it with `ensure_account`)."""


class UnknownTakeError(NotFoundError):
    """No take has this id."""


class AccountDeletedError(ApiError):
    """The account was deleted: it takes nothing (410)."""


class ConflictError(ApiError):
    """The request conflicts with stored state (409), e.g. an idempotency key already used for a
    different take on this account."""


class MetricKindChangedError(ConflictError):
    """The service's plan config changed this metric's kind or reset while the account's counter
    still holds usage counted the old way; nothing moved. An operator converts such counters
    (`quota-ledger convert-metric`); until then takes and releases of the metric are refused."""


class NotResettableError(ConflictError):
    """An allocation (seats) is never reset: its units are held by real things and come back by
    releases."""


class ServerError(ApiError):
    """The service failed (5xx), and kept failing through every retry."""


class ConnectionFailedError(QuotaClientError):
    """No answer from the service (connection refused or dropped, timeout) through every retry.
    The request may or may not have been applied; a take retried later with the same idempotency
    key still counts once."""


class QuotaExceededError(QuotaClientError):
    """`slot` was refused: the quota is exhausted. `take` has the numbers (used, limit, remaining)."""

    def __init__(self, take: TakeResult) -> None:
        super().__init__(
            f"{take.metric} of {take.account_id}: {take.units} more would exceed the limit "
            f"(used {take.used}, limit {take.limit}, remaining {take.remaining})"
        )
        self.take = take

    @property
    def used(self) -> int:
        return self.take.used

    @property
    def limit(self) -> int | None:
        return self.take.limit

    @property
    def remaining(self) -> int | None:
        return self.take.remaining


class LinesExceededError(QuotaClientError):
    """`slot` of several lines was refused: a quota is exhausted, and nothing was taken. `lines` names
    every line that did not fit (metric, units, remaining, limit); `result` is the refused take."""

    def __init__(self, result: TakeLinesResult) -> None:
        short = ", ".join(f"{s.metric} ({s.units} asked, {s.remaining} remaining)" for s in result.short)
        super().__init__(f"lines of {result.account_id} that would exceed their limits: {short}")
        self.result = result

    @property
    def lines(self) -> tuple[LineShortfall, ...]:
        return self.result.short


_BY_CODE: dict[str, type[ApiError]] = {
    "unknown_account": UnknownAccountError,
    "unknown_take": UnknownTakeError,
    "account_deleted": AccountDeletedError,
    "metric_kind_changed": MetricKindChangedError,
    "not_resettable": NotResettableError,
}
_BY_STATUS: dict[int, type[ApiError]] = {
    400: ValidationError,
    401: AuthError,
    403: AuthError,
    404: NotFoundError,
    409: ConflictError,
    410: AccountDeletedError,
    422: ValidationError,
}


def api_error(status: int, body: Any) -> ApiError:
    """The exception for an error answer: by the service's code first, then by status."""
    body = body if isinstance(body, dict) else {}
    code = body.get("error") if isinstance(body.get("error"), str) else f"http_{status}"
    message = body.get("message") if isinstance(body.get("message"), str) else "no message"
    details = {k: v for k, v in body.items() if k not in ("error", "message")}
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status) or (ServerError if status >= 500 else ApiError)
    return cls(status, code, message, details)
