"""The service's words for states and kinds, each defined once: the schemas, the API keys, the CLI and
the OpenAPI document take them from here. Where the database holds the same word list (a CHECK
constraint or a domain in migrations/), tests/db/test_vocabulary.py compares the two, so that
neither side can gain a word the other refuses.

Members are StrEnums: each is its own value, so it compares, formats and stores as the plain string.
"""

from __future__ import annotations

from enum import StrEnum


class AccountKind(StrEnum):
    USER = "user"
    TEAM = "team"


class SubscriptionStatus(StrEnum):
    """An account's billing status; `none` until a provider first says otherwise."""

    NONE = "none"
    TRIALING = "trialing"
    ACTIVE = "active"
    PAST_DUE = "past_due"
    UNPAID = "unpaid"
    INCOMPLETE = "incomplete"
    PAUSED = "paused"
    CANCELED = "canceled"
    EXPIRED = "expired"


# The statuses a provider can give a subscription (every one but `none`). Which of them keep access,
# end a subscription or win a tie is decided in SQL (migrations/repeatable/).
PROVIDER_STATUSES = frozenset(s.value for s in SubscriptionStatus if s is not SubscriptionStatus.NONE)


class Provider(StrEnum):
    STRIPE = "stripe"
    REVENUECAT = "revenuecat"


class InboxStatus(StrEnum):
    """What became of a stored provider event."""

    APPLIED = "applied"
    IGNORED = "ignored"
    UNMATCHED = "unmatched"
    FAILED = "failed"


class LedgerKind(StrEnum):
    TAKE = "take"
    RELEASE = "release"
    RESET = "reset"
    # A grant's rows (README "Credits"): created, drawn by a take, given back by a release, a
    # release's share forfeited (the grant had ended), voided, expired.
    GRANT = "grant"
    GRANT_TAKE = "grant_take"
    GRANT_RELEASE = "grant_release"
    GRANT_FORFEIT = "grant_forfeit"
    GRANT_VOID = "grant_void"
    GRANT_EXPIRE = "grant_expire"


class GrantSource(StrEnum):
    """Who gave a grant (credits): an admin, or a purchase through a provider."""

    ADMIN = "admin"
    STRIPE = "stripe"
    REVENUECAT = "revenuecat"


class Role(StrEnum):
    """An API key's role: what it may call."""

    PRODUCT = "product"
    ADMIN = "admin"
    FINANCE = "finance"


class ReleaseReason(StrEnum):
    """Why a release gave nothing back."""

    ALREADY_RELEASED = "already_released"
    PERIOD_CLOSED = "period_closed"  # a take of an earlier month, which its reset already cleared


class PurgeReason(StrEnum):
    """Why the inbox's retention removed events (counted in webhook_events_purged)."""

    RETENTION = "retention"  # past INBOX_APPLIED_DAYS / INBOX_IGNORED_DAYS
    OVER_BOUND = "over_bound"  # unmatched events over INBOX_UNMATCHED_LIMIT


class EventType(StrEnum):
    """What the service tells product services (docs/events.md): an event_outbox row's type, and the
    types a webhook endpoint subscribes to."""

    THRESHOLD_CROSSED = "quota.threshold_crossed"
    PLAN_CHANGED = "account.plan_changed"
    CREDITS_GRANTED = "credits.granted"
    CREDITS_VOIDED = "credits.voided"


class DeliveryStatus(StrEnum):
    """Where an event's delivery to one endpoint stands: waiting for its next attempt, or finished."""

    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"  # the retry schedule ran out, or the endpoint was disabled or deleted


class LimitSource(StrEnum):
    """Which rule set a counter's effective limit (the quotas table computes it)."""

    OVERRIDE = "override"
    FREE_FALLBACK = "free_fallback"
    PLAN = "plan"


# An account id: written `^...$` as JSON Schema and PostgreSQL read it; match it whole (fullmatch).
ACCOUNT_ID_PATTERN = r"^[A-Za-z0-9._:@-]{1,128}$"
ACCOUNT_ID_RULE = "1-128 characters of [A-Za-z0-9._:@-]"


class MetricKind(StrEnum):
    """How a metric's counter moves (plans.toml [metrics])."""

    CONSUMABLE = "consumable"  # used up, then zeroed at each period's start
    ALLOCATION = "allocation"  # held until released (seats); never reset


class ResetInterval(StrEnum):
    """When a consumable's counter starts from zero: the calendar month or the day, in UTC."""

    MONTH = "month"
    DAY = "day"
