"""Domain errors. Each one's docstring says what it means; `code` is its stable name for clients and
`status` the HTTP status that answers it. Declaring both here, beside the meaning, is the one mapping:
the HTTP layer's single handler reads them, and a test walks every class to hold each to a status."""

from __future__ import annotations

from typing import Any


class QuotaError(Exception):
    """Base of every domain error."""

    code = "error"
    status = 500  # every subclass declares its own (tests/unit/test_errors.py)

    def __init__(self, message: str | None = None, **details: Any) -> None:
        super().__init__(message or (self.__doc__ or self.code).strip())
        self.details = details

    @property
    def message(self) -> str:
        return str(self.args[0])


class UnknownAccount(QuotaError):
    """No account has this id."""

    code = "unknown_account"
    status = 404


class AccountDeleted(QuotaError):
    """This account was deleted; it takes nothing and is excluded from resets."""

    code = "account_deleted"
    status = 410


class UnknownMetric(QuotaError):
    """The plan config names no such metric."""

    code = "unknown_metric"
    status = 422


class UnknownFeature(QuotaError):
    """The plan config names no such feature."""

    code = "unknown_feature"
    status = 422


class QuotaExhausted(QuotaError):
    """The take would go over the limit; nothing was taken."""

    code = "quota_exhausted"
    status = 409


class UnknownTake(QuotaError):
    """No take has this id."""

    code = "unknown_take"
    status = 404


class IdempotencyKeyReused(QuotaError):
    """This idempotency key was already used for a different take (or grant) on this account."""

    code = "idempotency_key_reused"
    status = 409


class NotGrantable(QuotaError):
    """Credits (grants) are for consumable metrics only; an allocation (seats) takes none."""

    code = "not_grantable"
    status = 422


class UnknownGrant(QuotaError):
    """No grant has this id."""

    code = "unknown_grant"
    status = 404


class MetricKindChanged(QuotaError):
    """The plan config changed this metric's kind or reset while the account's counter still holds
    usage counted the old way; nothing was moved. `quota-ledger convert-metric` closes such counters
    (README, "Plan items")."""

    code = "metric_kind_changed"
    status = 409


class NotResettable(QuotaError):
    """An allocation is never reset: its units are held by real things and come back by releases."""

    code = "not_resettable"
    status = 409


class CustomerAlreadyLinked(QuotaError):
    """This Stripe customer is already linked to another account."""

    code = "customer_already_linked"
    status = 409


class PlanConfigError(QuotaError):
    """The plan config file is missing or invalid; nothing was changed."""

    code = "plan_config_invalid"
    status = 500  # the server's own file, never a client's doing


class WebhookRejected(QuotaError):
    """The webhook request was refused before anything was stored."""

    code = "webhook_rejected"
    status = 400


class InvalidSignature(WebhookRejected):
    """The Stripe-Signature header is missing, malformed, stale, from the future, or matches no secret."""

    code = "invalid_signature"
    status = 400


class WebhookUnauthorized(WebhookRejected):
    """The Authorization header of the webhook is missing or wrong."""

    code = "unauthorized"
    status = 401


class MalformedWebhook(WebhookRejected):
    """The webhook body is not an event this provider sends (bad JSON, missing id, type or time)."""

    code = "malformed_body"
    status = 400


class WebhooksNotConfigured(WebhookRejected):
    """No webhook secret is configured for this provider; the provider should retry later."""

    code = "webhooks_not_configured"
    status = 503


class UntranslatableEvent(QuotaError):
    """A verified event whose contents this service cannot read (e.g. an unknown status); stored as failed."""

    code = "untranslatable_event"
    status = 422


class UnknownEvent(QuotaError):
    """No stored webhook event has this id."""

    code = "unknown_event"
    status = 404


class InvalidUrl(QuotaError):
    """The webhook endpoint's URL is refused: not https, or naming (or resolving to) a loopback,
    private, link-local or otherwise reserved address; `reason` says which."""

    code = "invalid_url"
    status = 422


class UnknownEndpoint(QuotaError):
    """No webhook endpoint has this id (a deleted one included)."""

    code = "unknown_endpoint"
    status = 404


class UnknownDelivery(QuotaError):
    """No webhook delivery has this id."""

    code = "unknown_delivery"
    status = 404


class AlreadyDelivered(QuotaError):
    """This delivery was delivered; there is nothing to retry."""

    code = "already_delivered"
    status = 409


class EndpointDisabled(QuotaError):
    """The delivery's endpoint is disabled or deleted: nothing is sent to it any more."""

    code = "endpoint_disabled"
    status = 409
