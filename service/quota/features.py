"""Boolean features: what a plan offers besides its limits ("has SSO"), and their sticky admin
overrides. Which plan lists which feature is the plan config's; whether an account has one follows
the limits' precedence (override, else the free plan's features for a lapsed paid plan, else its
plan's), decided in one read (features.sql `account_features`). An override is the only stored
state, written with its audit row by one call; a call that changes nothing writes nothing."""

from __future__ import annotations

from dataclasses import dataclass

from psycopg.rows import class_row, dict_row

from service.db import Connection, Q
from service.errors import AccountDeleted, UnknownAccount, UnknownFeature
from service.plans import PlanConfig, array_literal


@dataclass(frozen=True, kw_only=True)
class FeatureView:
    """One feature of an account: whether it is on and which rule said so; `override` is the admin's
    (None: not set). `account_deleted` is the account's flag, read in the same statement."""

    feature: str
    enabled: bool
    source: str
    override: bool | None
    account_deleted: bool


def require_feature(plans: PlanConfig, feature: str) -> None:
    """Raise UnknownFeature unless some plan of the config names `feature`."""
    if feature not in plans.features:
        known = ", ".join(plans.features) or "none"
        raise UnknownFeature(f"unknown feature {feature!r}; known: {known}")


def account_features(
    conn: Connection, plans: PlanConfig, *, account_id: str, features: tuple[str, ...] | None = None
) -> list[FeatureView]:
    """The account's features (every feature of the config, or those named), one read; an empty
    list when the account does not exist."""
    params = {
        "account_id": account_id,
        "features": array_literal(plans.features if features is None else features),
        **plans.feature_table,
    }
    with conn.cursor(row_factory=class_row(FeatureView)) as cur:
        return cur.execute(Q.account_features, params).fetchall()


def feature(conn: Connection, plans: PlanConfig, *, account_id: str, feature: str) -> FeatureView:
    """One feature of a live account, or UnknownFeature, UnknownAccount, AccountDeleted."""
    require_feature(plans, feature)
    found = account_features(conn, plans, account_id=account_id, features=(feature,))
    if not found:
        raise UnknownAccount(f"unknown account {account_id!r}")
    if found[0].account_deleted:
        raise AccountDeleted(f"account {account_id!r} was deleted")
    return found[0]


def _change(
    conn: Connection, plans: PlanConfig, *, account_id: str, feature: str, enabled: bool | None, actor: str
) -> bool | None:
    require_feature(plans, feature)
    params = {"account_id": account_id, "feature": feature, "enabled": enabled, "actor": actor}
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q.feature_override_change, params).fetchone()
    if row is None:
        raise UnknownAccount(f"unknown account {account_id!r}")
    previous: bool | None = row["previous"]
    return previous


def set_override(
    conn: Connection, plans: PlanConfig, *, account_id: str, feature: str, enabled: bool, actor: str
) -> bool | None:
    """Turn `feature` on or off for the account whatever its plan; returns the previous override."""
    return _change(conn, plans, account_id=account_id, feature=feature, enabled=enabled, actor=actor)


def clear_override(
    conn: Connection, plans: PlanConfig, *, account_id: str, feature: str, actor: str
) -> bool | None:
    """Remove the override so the plan rules apply again; returns the previous override."""
    return _change(conn, plans, account_id=account_id, feature=feature, enabled=None, actor=actor)
