"""Accounts and their stored plan limits: creation and views. A tier or status change is billing's
(billing_set_tier, migrations/repeatable/billing_rules.sql), and the limits follow it in quota's SQL
(migrations/repeatable/quota_limits.sql)."""

from __future__ import annotations

from dataclasses import dataclass, field

from psycopg.rows import class_row, dict_row

from service.db import Connection, Q, transaction
from service.errors import AccountDeleted, CustomerAlreadyLinked, UnknownAccount, UnknownMetric
from service.plans import PlanConfig
from service.quota import periods
from service.quota.features import FeatureView, account_features


def require_metric(plans: PlanConfig, metric: str) -> None:
    """Raise UnknownMetric unless the plan config names `metric`."""
    if metric not in plans.metrics:
        raise UnknownMetric(f"unknown metric {metric!r}; known: {', '.join(plans.metrics)}")


@dataclass(frozen=True, kw_only=True)
class MetricView:
    """One metric of an account: its effective limit (None = unlimited), which rule set it, usage."""

    metric: str
    kind: str  # 'consumable' | 'allocation'
    reset: str | None  # 'month' | 'day'; None for an allocation
    limit: int | None
    limit_source: str
    used: int
    counter_period: str  # periods.HELD for an allocation
    plan_limit: int | None
    override_set: bool
    override_limit: int | None
    credits: int = 0  # what the live grants of this metric have left (README "Credits")

    @property
    def remaining(self) -> int | None:
        """The allowance left, plus the credits; None when unlimited."""
        return None if self.limit is None else max(self.limit - self.used, 0) + self.credits

    @property
    def over_limit(self) -> bool:
        """More is held or used than the limit allows now (a downgrade, a lower override): nothing is
        given back by itself, and takes are refused until it is below again."""
        return self.limit is not None and self.used > self.limit

    @property
    def period(self) -> str | None:
        return periods.shown(self.counter_period)

    @property
    def resets_at(self) -> str | None:
        return periods.resets_at(self.counter_period)

    @property
    def override(self) -> dict[str, int | None] | None:
        """The sticky override as the admin sees it: {limit} (None = unlimited), or None when unset."""
        return {"limit": self.override_limit} if self.override_set else None


@dataclass(frozen=True, kw_only=True)
class Account:
    """An account as stored."""

    id: str
    kind: str
    plan: str
    subscription_status: str
    stripe_customer_id: str | None
    deleted: bool


@dataclass(frozen=True, kw_only=True)
class AccountView(Account):
    """The account with one MetricView per metric of the plan config."""

    limits: list[MetricView] = field(default_factory=list)
    features: list[FeatureView] = field(default_factory=list)  # every feature of the plan config

    @property
    def by_metric(self) -> dict[str, MetricView]:
        return {m.metric: m for m in self.limits}

    @property
    def by_feature(self) -> dict[str, FeatureView]:
        return {f.feature: f for f in self.features}


def _limit_params(plans: PlanConfig, plan: str) -> dict[str, object]:
    metrics = list(plans.metrics)
    return {
        "metrics": metrics,
        "plan_limits": [plans.limit(plan, m) for m in metrics],
        "free_limits": [plans.limit(plans.free_plan, m) for m in metrics],
    }


def current_periods(plans: PlanConfig, period: str | None = None) -> list[str]:
    """Each metric's current period, in plans.metrics order. `period` (a month, or a day) stands
    for now for the metrics whose periods are of its kind (a caller on another clock: the admin's
    reset of a given month, tests)."""
    now = periods.now()
    found = [plans.period(m, now) for m in plans.metrics]
    return [period if period is not None and len(period) == len(p) else p for p in found]


def find_account(conn: Connection, *, account_id: str) -> Account:
    """The stored account, or UnknownAccount."""
    with conn.cursor(row_factory=class_row(Account)) as cur:
        acct = cur.execute(Q.account_get, {"account_id": account_id}).fetchone()
    if acct is None:
        raise UnknownAccount(f"unknown account {account_id!r}")
    return acct


def ensure_quotas(conn: Connection, plans: PlanConfig, *, account_id: str, period: str | None = None) -> None:
    """Create the counter rows that `account_id` lacks, with its plan's limits."""
    acct = find_account(conn, account_id=account_id)
    conn.execute(
        Q.ensure_quotas,
        {
            "account_id": account_id,
            "periods": current_periods(plans, period),
            "free_plan": plans.free_plan,
            **_limit_params(plans, acct.plan),
        },
    )


class _CreatedMeanwhile(Exception):
    """The account was created by another transaction after its customer was read: the customer
    that one named is not known here, so the upsert runs again."""


_UPSERT_ATTEMPTS = 3


def upsert_account(
    conn: Connection, plans: PlanConfig, *, account_id: str, kind: str, stripe_customer_id: str | None = None
) -> bool:
    """Create the account on the free plan, or update its kind and customer link. True if created.
    A deleted account raises AccountDeleted; a customer linked elsewhere CustomerAlreadyLinked.

    One customer per account, and one account per customer, by the customer's own row
    (stripe_customers, migrations/0013), written in the upsert's transaction: on Citus a unique
    index on accounts cannot hold it (README "Scaling out")."""
    for attempt in range(1, _UPSERT_ATTEMPTS + 1):
        try:
            with transaction(conn), conn.cursor(row_factory=dict_row) as cur:
                existed = None
                if stripe_customer_id is not None:
                    existed = _claim_customer(conn, account_id=account_id, customer_id=stripe_customer_id)
                row = cur.execute(
                    Q.account_upsert,
                    {
                        "account_id": account_id,
                        "kind": kind,
                        "plan": plans.free_plan,
                        "stripe_customer_id": stripe_customer_id,
                    },
                ).fetchone()
                if row is None:
                    raise AccountDeleted(f"account {account_id!r} was deleted")
                if existed is False and not row["created"]:
                    raise _CreatedMeanwhile
                ensure_quotas(conn, plans, account_id=account_id)
            return bool(row["created"])
        except _CreatedMeanwhile:
            if attempt == _UPSERT_ATTEMPTS:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def _claim_customer(conn: Connection, *, account_id: str, customer_id: str) -> bool:
    """Claim `customer_id` for the account, releasing the customer it named before, under the
    account's row lock; CustomerAlreadyLinked if another account has it. Returns whether the
    account existed."""
    params = {"account_id": account_id, "customer_id": customer_id}
    with conn.cursor(row_factory=dict_row) as cur:
        current = cur.execute(Q.account_customer_for_update, params).fetchone()
        previous = current["stripe_customer_id"] if current else None
        if previous is not None and previous != customer_id:
            cur.execute(Q.stripe_customer_release, {**params, "customer_id": previous})
        if cur.execute(Q.stripe_customer_claim, params).fetchone() is None:
            raise CustomerAlreadyLinked(
                f"Stripe customer {customer_id!r} is already linked to another account"
            )
    return current is not None


def get_account(
    conn: Connection, plans: PlanConfig, *, account_id: str, period: str | None = None
) -> AccountView:
    """The account with one MetricView per metric of the plan config."""
    acct = find_account(conn, account_id=account_id)
    metrics = [plans.metric(m) for m in plans.metrics]
    params = {
        "account_id": account_id,
        "metrics": list(plans.metrics),
        "periods": current_periods(plans, period),
        "kinds": [m.kind for m in metrics],
        "resets": [m.reset for m in metrics],
    }
    with conn.cursor(row_factory=class_row(MetricView)) as cur:
        limits = cur.execute(Q.account_quotas, params).fetchall()
    if len(limits) < len(plans.metrics):  # a metric added to the config since the account was made
        ensure_quotas(conn, plans, account_id=account_id, period=period)
        with conn.cursor(row_factory=class_row(MetricView)) as cur:
            limits = cur.execute(Q.account_quotas, params).fetchall()
    return AccountView(
        **vars(acct), limits=limits, features=account_features(conn, plans, account_id=account_id)
    )


def search(
    conn: Connection,
    *,
    prefix: str | None = None,
    customer_id: str | None = None,
    plan: str | None = None,
    after: str = "",
    limit: int = 50,
) -> list[Account]:
    """Accounts in id order after `after`, at most `limit`: those whose id starts with `prefix`,
    linked to the Stripe customer `customer_id`, on `plan` (each None: any)."""
    params = {"prefix": prefix, "customer_id": customer_id, "plan": plan, "after": after, "limit": limit}
    with conn.cursor(row_factory=class_row(Account)) as cur:
        return cur.execute(Q.account_search, params).fetchall()
