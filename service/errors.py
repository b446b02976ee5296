"""Domain errors. Each one's docstring says what it means; `code` is its stable name for clients."""

from __future__ import annotations

from typing import Any


class QuotaError(Exception):
    """Base of every domain error."""

    code = "error"

    def __init__(self, message: str | None = None, **details: Any) -> None:
        super().__init__(message or (self.__doc__ or self.code).strip())
        self.details = details

    @property
    def message(self) -> str:
        return str(self.args[0])


class UnknownAccount(QuotaError):
    """No account has this id."""

    code = "unknown_account"


class AccountDeleted(QuotaError):
    """This account was deleted; it takes nothing and is excluded from resets."""

    code = "account_deleted"


class UnknownMetric(QuotaError):
    """The plan config names no such metric."""

    code = "unknown_metric"


class QuotaExhausted(QuotaError):
    """The take would go over the limit; nothing was taken."""

    code = "quota_exhausted"


class UnknownTake(QuotaError):
    """No take has this id."""

    code = "unknown_take"


class IdempotencyKeyReused(QuotaError):
    """This idempotency key was already used for a different take on this account."""

    code = "idempotency_key_reused"


class CustomerAlreadyLinked(QuotaError):
    """This Stripe customer is already linked to another account."""

    code = "customer_already_linked"


class PlanConfigError(QuotaError):
    """The plan config file is missing or invalid; nothing was changed."""

    code = "plan_config_invalid"
