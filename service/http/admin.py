"""Admin API (role admin): the admin account view, sticky overrides, resets, delete and restore."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from service.http import openapi, schemas
from service.http.auth import actor, require
from service.http.runtime import runtime
from service.http.validation import account_id, json_body
from service.http.views import account_json, metric_json
from service.quota import accounts, admin, overrides, periods

bp = Blueprint("admin", __name__, url_prefix="/v1/admin")


@bp.get("/accounts/<id>")
@require("admin")
def get_account(id: str) -> Response:
    rt = runtime()
    with rt.connection() as conn:
        view = accounts.get_account(conn, rt.plans, account_id=account_id(id))
    return jsonify(account_json(view, admin=True))


def _metric_after(id: str, metric: str, previous: dict[str, object] | None) -> Response:
    rt = runtime()
    with rt.connection() as conn:
        view = accounts.get_account(conn, rt.plans, account_id=id)
    m = next(m for m in view.limits if m.metric == metric)
    return jsonify({"account_id": id, "metric": metric, **metric_json(m, admin=True), "previous": previous})


@bp.put("/accounts/<id>/overrides/<metric>")
@require("admin")
def put_override(id: str, metric: str) -> Response:
    body = json_body(schemas.OverridePut())
    rt = runtime()
    with rt.connection() as conn:
        previous = overrides.set_override(
            conn, rt.plans, account_id=account_id(id), metric=metric, limit=body["limit"], actor=actor()
        )
    return _metric_after(id, metric, previous)


@bp.delete("/accounts/<id>/overrides/<metric>")
@require("admin")
def delete_override(id: str, metric: str) -> Response:
    rt = runtime()
    with rt.connection() as conn:
        previous = overrides.clear_override(
            conn, rt.plans, account_id=account_id(id), metric=metric, actor=actor()
        )
    return _metric_after(id, metric, previous)


@bp.post("/accounts/<id>/reset")
@require("admin")
def post_reset(id: str) -> Response:
    body = json_body(schemas.ResetRequest())
    rt = runtime()
    period = periods.current_period()
    with rt.connection() as conn:
        previous = admin.reset_counter(
            conn, rt.plans, account_id=account_id(id), metric=body["metric"], actor=actor(), period=period
        )
    return jsonify(
        {"account_id": id, "metric": body["metric"], "period": period, "previous": previous, "used": 0}
    )


@bp.delete("/accounts/<id>")
@require("admin")
def delete_account(id: str) -> Response:
    with runtime().connection() as conn:
        admin.soft_delete(conn, account_id=account_id(id), actor=actor())
    return jsonify({"id": id, "deleted": True})


@bp.post("/accounts/<id>/restore")
@require("admin")
def restore_account(id: str) -> Response:
    with runtime().connection() as conn:
        restored = admin.restore(conn, account_id=account_id(id), actor=actor())
    return jsonify({"id": id, "deleted": False, "restored": restored})


E = schemas.Error
ERR = {400: E, 401: E, 403: E, 404: E, 422: E}
openapi.register(
    "post",
    "/v1/admin/accounts/{id}/reset",
    "Reset a counter to 0 (one ledger row)",
    "admin",
    schemas.ResetRequest,
    {200: schemas.ResetResponse, 410: E, **ERR},
)
openapi.register(
    "delete",
    "/v1/admin/accounts/{id}",
    "Soft-delete an account",
    "admin",
    None,
    {200: schemas.DeleteResponse, **ERR},
)
openapi.register(
    "post",
    "/v1/admin/accounts/{id}/restore",
    "Restore a soft-deleted account (audited; a live account is left as it is)",
    "admin",
    None,
    {200: schemas.RestoreResponse, **ERR},
)
