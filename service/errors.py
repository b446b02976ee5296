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


class WebhookRejected(QuotaError):
    """The webhook request was refused before anything was stored."""

    code = "webhook_rejected"


class InvalidSignature(WebhookRejected):
    """The Stripe-Signature header is missing, malformed, stale, from the future, or matches no secret."""

    code = "invalid_signature"


class WebhookUnauthorized(WebhookRejected):
    """The Authorization header of the webhook is missing or wrong."""

    code = "unauthorized"


class MalformedWebhook(WebhookRejected):
    """The webhook body is not an event this provider sends (bad JSON, missing id, type or time)."""

    code = "malformed_body"


class WebhooksNotConfigured(WebhookRejected):
    """No webhook secret is configured for this provider; the provider should retry later."""

    code = "webhooks_not_configured"


class UntranslatableEvent(QuotaError):
    """A verified event whose contents this service cannot read (e.g. an unknown status); stored as failed."""

    code = "untranslatable_event"


class UnknownEvent(QuotaError):
    """No stored webhook event has this id."""

    code = "unknown_event"
