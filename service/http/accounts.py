"""Product API: accounts, takes, releases, usage (role product; admin may too)."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from service.billing import inbox
from service.http import schemas
from service.http.auth import actor, require
from service.http.errors import ApiError
from service.http.metrics import RELEASES, TAKES
from service.http.runtime import runtime
from service.http.validation import account_id, json_body, query_args
from service.http.views import account_json, release_json, take_json
from service.http.webhooks import translator
from service.quota import accounts, periods, takes, usage

bp = Blueprint("accounts", __name__, url_prefix="/v1")
PRODUCT = ("product", "admin")
# Built once: a marshmallow Schema deep-copies its declared fields on construction (~30 us, as
# much as the load itself), and load() keeps no state on the instance.
ACCOUNT_PUT = schemas.AccountPut()
TAKE_REQUEST = schemas.TakeRequest()
USAGE_QUERY = schemas.UsageQuery()


@bp.put("/accounts/<id>")
@require(*PRODUCT)
def put_account(id: str) -> tuple[Response, int]:
    body = json_body(ACCOUNT_PUT)
    rt = runtime()
    with rt.connection() as conn:
        created = accounts.upsert_account(conn, rt.plans, account_id=account_id(id), **body)
        if created or body.get("stripe_customer_id"):
            # Provider events that arrived before the account (or its customer) was known wait
            # as unmatched; the new link applies them now, so the view below shows their effect.
            inbox.apply_waiting(
                conn,
                rt.plans,
                account_ids=(id,),
                customer_id=body.get("stripe_customer_id"),
                translate_for=translator,
            )
        view = accounts.get_account(conn, rt.plans, account_id=id)
    return jsonify(account_json(view)), 201 if created else 200


@bp.get("/accounts/<id>")
@require(*PRODUCT)
def get_account(id: str) -> Response:
    rt = runtime()
    with rt.connection() as conn:
        view = accounts.get_account(conn, rt.plans, account_id=account_id(id))
    return jsonify(account_json(view))


@bp.post("/accounts/<id>/takes")
@require(*PRODUCT)
def post_take(id: str) -> tuple[Response, int]:
    body = json_body(TAKE_REQUEST)
    rt = runtime()
    try:
        with rt.connection() as conn:
            granted = takes.take(conn, rt.plans, account_id=account_id(id), actor=actor(), **body)
    except Exception as e:
        TAKES.labels(getattr(e, "code", "error")).inc()
        raise
    TAKES.labels("replayed" if granted.replayed else "granted").inc()
    return jsonify(take_json(granted)), 200 if granted.replayed else 201


@bp.post("/accounts/<id>/takes/<int:take_id>/release")
@require(*PRODUCT)
def post_account_release(id: str, take_id: int) -> Response:
    """The release route that names the account: one shard under Citus (README "Scaling out")."""
    return _release(take_id, account_id(id))


@bp.post("/takes/<int:take_id>/release")
@require(*PRODUCT)
def post_release(take_id: int) -> Response:
    return _release(take_id, None)


def _release(take_id: int, account: str | None) -> Response:
    rt = runtime()
    with rt.connection() as conn:
        result = takes.release(conn, take_id=take_id, actor=actor(), account_id=account)
    RELEASES.labels("released" if result.released else str(result.reason)).inc()
    return jsonify(release_json(result))


@bp.get("/accounts/<id>/usage")
@require(*PRODUCT)
def get_usage(id: str) -> Response:
    args = query_args(USAGE_QUERY)
    rt = runtime()
    if args["metric"] not in rt.plans.metrics:
        raise ApiError(
            422,
            "validation_failed",
            "the request is not valid",
            fields={"metric": [f"unknown metric; known: {', '.join(rt.plans.metrics)}"]},
        )
    with rt.connection() as conn:
        period = args.get("period")
        used = usage.usage(conn, account_id=account_id(id), metric=args["metric"], period=period)
    return jsonify({"metric": args["metric"], "period": period or periods.current_period(), "used": used})
