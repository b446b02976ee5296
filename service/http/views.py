"""Shapes of the JSON the API returns, built from domain objects."""

from __future__ import annotations

from typing import Any

from service.quota.accounts import AccountView, MetricView
from service.quota.takes import Release, Take


def metric_json(m: MetricView, *, admin: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {
        "limit": m.limit,
        "limit_source": m.limit_source,
        "used": m.used,
        "remaining": m.remaining,
        "period": m.period,
        "resets_at": m.resets_at,
    }
    if admin:
        out["plan_limit"] = m.plan_limit
        out["override"] = {"limit": m.override_limit} if m.override_set else None
    return out


def account_json(a: AccountView, *, admin: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": a.id,
        "kind": a.kind,
        "plan": a.plan,
        "subscription_status": a.subscription_status,
        "deleted": a.deleted,
        "limits": {m.metric: metric_json(m, admin=admin) for m in a.limits},
    }
    if admin:
        out["stripe_customer_id"] = a.stripe_customer_id
    return out


def take_json(t: Take) -> dict[str, Any]:
    return {
        "take_id": t.take_id,
        "metric": t.metric,
        "units": t.units,
        "used": t.used,
        "limit": t.limit,
        "remaining": t.remaining,
        "period": t.period,
        "limit_source": t.limit_source,
    }


def release_json(r: Release) -> dict[str, Any]:
    if not r.released:
        return {"released": False, "reason": r.reason, "take_id": r.take_id}
    return {
        "released": True,
        "take_id": r.take_id,
        "metric": r.metric,
        "units": r.units,
        "used": r.used,
        "limit": r.limit,
        "remaining": r.remaining,
        "period": r.period,
        "limit_source": r.limit_source,
    }
