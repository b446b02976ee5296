"""Admin API (role admin): the admin account view, sticky overrides, resets, delete and restore."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flask import Blueprint, Response, jsonify

from service.errors import (
    AccountDeleted,
    IdempotencyKeyReused,
    NotGrantable,
    NotResettable,
    UnknownAccount,
    UnknownFeature,
    UnknownGrant,
    UnknownMetric,
)
from service.http.auth import actor, require
from service.http.errors import InvalidJson, ValidationFailed, refuses
from service.http.runtime import runtime
from service.http.schemas import requests as rq
from service.http.schemas import responses as rs
from service.http.validation import account_id, json_body
from service.quota import accounts, admin, features, grants, overrides
from service.quota.accounts import MetricView
from service.quota.features import FeatureView

bp = Blueprint("admin", __name__, url_prefix="/v1/admin")


@bp.get("/accounts/<id>")
@require("admin")
@refuses(ValidationFailed, UnknownAccount)
def get_account(id: str) -> Response:
    """The admin view: plan limits, overrides (of limits and of features), the Stripe customer.
    ---
    get:
      responses:
        200: {description: the account, content: {application/json: {schema: AdminAccount}}}
    """
    rt = runtime()
    with rt.connection() as conn:
        view = accounts.get_account(conn, rt.plans, account_id=account_id(id))
    return jsonify(rs.ADMIN_ACCOUNT.dump(view))


@dataclass(frozen=True)
class _OverrideChange:
    """What an override endpoint answers: the metric (or feature) as it is now, and the override it
    replaced."""

    account_id: str
    previous: dict[str, object] | bool | None
    now: MetricView | FeatureView

    def __getattr__(self, name: str) -> Any:
        return getattr(self.now, name)


def _after(id: str, metric: str, previous: dict[str, object] | None) -> Response:
    rt = runtime()
    with rt.connection() as conn:
        view = accounts.get_account(conn, rt.plans, account_id=id)
    return jsonify(rs.OVERRIDE_CHANGE.dump(_OverrideChange(id, previous, view.by_metric[metric])))


@bp.put("/accounts/<id>/overrides/<metric>")
@require("admin")
@refuses(InvalidJson, ValidationFailed, UnknownMetric, UnknownAccount)
def put_override(id: str, metric: str) -> Response:
    """Set a sticky override (null = unlimited), audited unless it is the value already set.
    ---
    put:
      requestBody: {required: true, content: {application/json: {schema: OverridePut}}}
      responses:
        200: {description: the metric now, content: {application/json: {schema: OverrideChange}}}
    """
    body = json_body(rq.OVERRIDE_PUT)
    rt = runtime()
    with rt.connection() as conn:
        previous = overrides.set_override(
            conn, rt.plans, account_id=account_id(id), metric=metric, limit=body["limit"], actor=actor()
        )
    return _after(id, metric, previous)


@bp.delete("/accounts/<id>/overrides/<metric>")
@require("admin")
@refuses(ValidationFailed, UnknownMetric, UnknownAccount)
def delete_override(id: str, metric: str) -> Response:
    """Clear a sticky override, audited unless none was set.
    ---
    delete:
      responses:
        200: {description: the metric now, content: {application/json: {schema: OverrideChange}}}
    """
    rt = runtime()
    with rt.connection() as conn:
        previous = overrides.clear_override(
            conn, rt.plans, account_id=account_id(id), metric=metric, actor=actor()
        )
    return _after(id, metric, previous)


def _feature_after(id: str, feature: str, previous: bool | None) -> Response:
    rt = runtime()
    with rt.connection() as conn:
        [now] = features.account_features(conn, rt.plans, account_id=id, features=(feature,))
    return jsonify(rs.FEATURE_OVERRIDE_CHANGE.dump(_OverrideChange(id, previous, now)))


@bp.put("/accounts/<id>/features/<feature>")
@require("admin")
@refuses(InvalidJson, ValidationFailed, UnknownFeature, UnknownAccount)
def put_feature(id: str, feature: str) -> Response:
    """Turn a boolean feature on or off whatever the plan (sticky), audited unless already so.
    ---
    put:
      requestBody: {required: true, content: {application/json: {schema: FeaturePut}}}
      responses:
        200: {description: the feature now, content: {application/json: {schema: FeatureOverrideChange}}}
    """
    body = json_body(rq.FEATURE_PUT)
    rt = runtime()
    with rt.connection() as conn:
        previous = features.set_override(
            conn, rt.plans, account_id=account_id(id), feature=feature, enabled=body["enabled"], actor=actor()
        )
    return _feature_after(id, feature, previous)


@bp.delete("/accounts/<id>/features/<feature>")
@require("admin")
@refuses(ValidationFailed, UnknownFeature, UnknownAccount)
def delete_feature(id: str, feature: str) -> Response:
    """Clear a feature's override so the plan decides again, audited unless none was set.
    ---
    delete:
      responses:
        200: {description: the feature now, content: {application/json: {schema: FeatureOverrideChange}}}
    """
    rt = runtime()
    with rt.connection() as conn:
        previous = features.clear_override(
            conn, rt.plans, account_id=account_id(id), feature=feature, actor=actor()
        )
    return _feature_after(id, feature, previous)


@bp.post("/accounts/<id>/reset")
@require("admin")
@refuses(InvalidJson, ValidationFailed, UnknownMetric, UnknownAccount, AccountDeleted, NotResettable)
def post_reset(id: str) -> Response:
    """Reset a counter of its current period (month or day) to 0: one reset ledger row naming the key,
    audited. An allocation's is refused (409 not_resettable): releases give its units back.
    ---
    post:
      requestBody: {required: true, content: {application/json: {schema: ResetRequest}}}
      responses:
        200: {description: reset, content: {application/json: {schema: ResetResponse}}}
    """
    body = json_body(rq.RESET_REQUEST)
    rt = runtime()
    period = rt.plans.period(body["metric"])
    with rt.connection() as conn:
        previous = admin.reset_counter(
            conn, rt.plans, account_id=account_id(id), metric=body["metric"], actor=actor(), period=period
        )
    return jsonify(
        rs.RESET.dump(
            {"account_id": id, "metric": body["metric"], "period": period, "previous": previous, "used": 0}
        )
    )


@bp.delete("/accounts/<id>")
@require("admin")
@refuses(ValidationFailed, UnknownAccount)
def delete_account(id: str) -> Response:
    """Soft-delete an account: takes refused (410), skipped by resets; again is the same 200.
    ---
    delete:
      responses:
        200: {description: deleted, content: {application/json: {schema: DeleteResponse}}}
    """
    with runtime().connection() as conn:
        admin.soft_delete(conn, account_id=account_id(id), actor=actor())
    return jsonify(rs.DELETED.dump({"id": id, "deleted": True}))


@bp.post("/accounts/<id>/restore")
@require("admin")
@refuses(ValidationFailed, UnknownAccount)
def restore_account(id: str) -> Response:
    """Undo a soft delete (audited); a live account is left as it is.
    ---
    post:
      responses:
        200: {description: restored, or was live, content: {application/json: {schema: RestoreResponse}}}
    """
    with runtime().connection() as conn:
        restored = admin.restore(conn, account_id=account_id(id), actor=actor())
    return jsonify(rs.RESTORED.dump({"id": id, "deleted": False, "restored": restored}))


@bp.post("/accounts/<id>/grants")
@require("admin")
@refuses(
    InvalidJson,
    ValidationFailed,
    UnknownMetric,
    NotGrantable,
    UnknownAccount,
    AccountDeleted,
    IdempotencyKeyReused,
)
def post_grant(id: str) -> tuple[Response, int]:
    """Grant units of a consumable metric on top of the plan (credits), audited; the same key again
    answers 200 with the first grant and writes nothing.
    ---
    post:
      requestBody: {required: true, content: {application/json: {schema: GrantRequest}}}
      responses:
        200: {description: this key's earlier grant, content: {application/json: {schema: GrantResponse}}}
        201: {description: granted, content: {application/json: {schema: GrantResponse}}}
    """
    body = json_body(rq.GRANT_REQUEST)
    rt = runtime()
    with rt.connection() as conn:
        grant = grants.admin_grant(conn, rt.plans, account_id=account_id(id), actor=actor(), **body)
    return jsonify(rs.GRANT.dump(grant)), 201 if grant.created else 200


@bp.post("/grants/<int:grant_id>/void")
@require("admin")
@refuses(UnknownGrant)
def void_grant(grant_id: int) -> Response:
    """Void a grant forward-only: what is left is forfeited, what takes drew stays used; audited.
    Again: the same answer, nothing written.
    ---
    post:
      responses:
        200: {description: voided, content: {application/json: {schema: VoidResponse}}}
    """
    with runtime().connection() as conn:
        voided = grants.void_grant(conn, grant_id=grant_id, actor=actor())
    return jsonify(rs.VOIDED.dump(voided))
