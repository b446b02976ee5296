"""Admin API (role admin): the admin account view and sticky overrides."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from service.http import schemas
from service.http.auth import actor, require
from service.http.runtime import runtime
from service.http.validation import account_id, json_body
from service.http.views import account_json, metric_json
from service.quota import accounts, overrides

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
