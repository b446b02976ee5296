"""Product API: accounts, takes, releases, usage (role product; admin may too).

Each view's docstring holds its OpenAPI operation (read by service/http/openapi.py), and `@refuses`
declares the errors it may answer, which the document lists with their statuses."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from service import webhooks
from service.billing import delivery
from service.errors import (
    AccountDeleted,
    CustomerAlreadyLinked,
    IdempotencyKeyReused,
    MetricKindChanged,
    QuotaError,
    QuotaExhausted,
    UnknownAccount,
    UnknownFeature,
    UnknownMetric,
    UnknownTake,
)
from service.http.auth import actor, require
from service.http.errors import InvalidJson, ValidationFailed, refusal_body, refuses
from service.http.metrics import RELEASES, TAKE_OUTCOMES
from service.http.runtime import runtime
from service.http.schemas import requests as rq
from service.http.schemas import responses as rs
from service.http.validation import account_id, json_body, json_object, load, query_args
from service.quota import accounts, check, features, grants, history, periods, takes, usage

bp = Blueprint("accounts", __name__, url_prefix="/v1")
PRODUCT = ("product", "admin")


@bp.put("/accounts/<id>")
@require(*PRODUCT)
@refuses(InvalidJson, ValidationFailed, CustomerAlreadyLinked, AccountDeleted)
def put_account(id: str) -> tuple[Response, int]:
    """Create (201) or update (200) an account.
    ---
    put:
      requestBody: {required: true, content: {application/json: {schema: AccountPut}}}
      responses:
        200: {description: updated, content: {application/json: {schema: Account}}}
        201: {description: created, content: {application/json: {schema: Account}}}
    """
    body = json_body(rq.ACCOUNT_PUT)
    rt = runtime()
    with rt.connection() as conn:
        created = accounts.upsert_account(conn, rt.plans, account_id=account_id(id), **body)
        if created or body.get("stripe_customer_id"):
            # Provider events that arrived before the account (or its customer) was known wait
            # as unmatched; the new link applies them now, so the view below shows their effect.
            delivery.apply_waiting(
                conn,
                rt.plans,
                account_ids=(id,),
                customer_id=body.get("stripe_customer_id"),
                translate_for=webhooks.translators(rt.settings.webhook_environment),
            )
        view = accounts.get_account(conn, rt.plans, account_id=id)
    return jsonify(rs.ACCOUNT.dump(view)), 201 if created else 200


@bp.get("/accounts/<id>")
@require(*PRODUCT)
@refuses(ValidationFailed, UnknownAccount)
def get_account(id: str) -> Response:
    """An account with its effective limits, usage and features.
    ---
    get:
      responses:
        200: {description: the account, content: {application/json: {schema: Account}}}
    """
    rt = runtime()
    with rt.connection() as conn:
        view = accounts.get_account(conn, rt.plans, account_id=account_id(id))
    return jsonify(rs.ACCOUNT.dump(view))


@bp.get("/accounts/<id>/check")
@require(*PRODUCT)
@refuses(ValidationFailed, UnknownMetric, UnknownFeature, UnknownAccount, AccountDeleted, MetricKindChanged)
def get_check(id: str) -> Response:
    """Whether a take of `units` of `metric` would be granted now, or whether `feature` is on; writes nothing.
    ---
    get:
      parameters: [{in: query, schema: CheckQuery}]
      responses:
        200:
          description: "a MetricCheck for `metric`, a FeatureCheck for `feature`. Only a take enforces a
            limit: a check can be outdated by the time its caller acts."
          content: {application/json: {schema: {anyOf: [MetricCheck, FeatureCheck]}}}
    """
    args = query_args(rq.CHECK_QUERY)
    rt = runtime()
    with rt.connection() as conn:
        if "feature" in args:
            f = features.feature(conn, rt.plans, account_id=account_id(id), feature=args["feature"])
            return jsonify(
                rs.FEATURE_CHECK.dump({"allowed": f.enabled, "feature": f.feature, "source": f.source})
            )
        counter = check.check_metric(
            conn, rt.plans, account_id=account_id(id), metric=args["metric"], units=args.get("units", 1)
        )
    return jsonify(rs.METRIC_CHECK.dump(counter))


@bp.post("/accounts/<id>/takes")
@require(*PRODUCT)
@refuses(
    InvalidJson,
    ValidationFailed,
    UnknownMetric,
    UnknownAccount,
    AccountDeleted,
    QuotaExhausted,
    IdempotencyKeyReused,
    MetricKindChanged,
)
def post_take(id: str) -> tuple[Response, int]:
    """Take units of a quota, atomically: one metric, or several lines all or none.
    ---
    post:
      requestBody:
        required: true
        content: {application/json: {schema: {oneOf: [TakeRequest, TakeLinesRequest]}}}
      responses:
        200:
          description: the original take (or takes, of lines) of this idempotency key
          content: {application/json: {schema: {oneOf: [TakeResponse, TakeLinesResponse]}}}
        201:
          description: "taken: a TakeResponse for `metric`, a TakeLinesResponse for `lines`"
          content: {application/json: {schema: {oneOf: [TakeResponse, TakeLinesResponse]}}}
    """
    raw = json_object()
    # A body with `metric` too is refused by TakeLinesRequest (an unknown field), and `lines` by TakeRequest.
    body = load(rq.TAKE_LINES_REQUEST if "lines" in raw else rq.TAKE_REQUEST, raw)
    rt = runtime()
    try:
        account = account_id(id)
        if "lines" in body:
            lines = [takes.Line(**line) for line in body.pop("lines")]
            with rt.connection() as conn:
                granted = takes.take_lines(
                    conn, rt.plans, account_id=account, lines=lines, actor=actor(), **body
                )
            answer = rs.TAKE_LINES.dump({"takes": granted})
        else:
            with rt.connection() as conn:
                granted = [takes.take(conn, rt.plans, account_id=account, actor=actor(), **body)]
            answer = rs.TAKE.dump(granted[0])
    except Exception as e:
        TAKE_OUTCOMES.labels(getattr(e, "code", "error")).inc()
        raise
    replayed = granted[0].replayed
    TAKE_OUTCOMES.labels("replayed" if replayed else "granted").inc()
    return jsonify(answer), 200 if replayed else 201


@bp.post("/takes/batch")
@require(*PRODUCT)
@refuses(InvalidJson, ValidationFailed)
def post_take_batch() -> Response:
    """Many independent takes, of any accounts, in one request: each item answered as a single take.
    ---
    post:
      requestBody: {required: true, content: {application/json: {schema: TakeBatchRequest}}}
      responses:
        200:
          description: "one result per item, in item order: the status a single take would answer
            and its body. Not atomic: each item is granted or refused on its own."
          content: {application/json: {schema: TakeBatchResponse}}
    """
    items = json_body(rq.TAKE_BATCH_REQUEST)["items"]
    results: list[takes.Take | QuotaError | ValidationFailed | None] = [None] * len(items)
    valid: list[tuple[int, takes.TakeItem]] = []
    for i, item in enumerate(items):
        try:
            fields = load(rq.TAKE_ITEM, item)
            valid.append((i, takes.TakeItem(**{**fields, "account_id": account_id(fields["account_id"])})))
        except ValidationFailed as e:
            results[i] = e
    if valid:
        rt = runtime()
        with rt.connection() as conn:
            done = takes.take_each(conn, rt.plans, [item for _, item in valid], actor=actor())
        for (i, _), result in zip(valid, done, strict=True):
            results[i] = result
    return jsonify({"results": [_item_result(r) for r in results if r is not None]})


def _item_result(result: takes.Take | QuotaError | ValidationFailed) -> dict[str, object]:
    """A batch item's result: the status and body a single take would answer (the one mapping of
    errors to bodies: service/http/errors.py)."""
    if isinstance(result, takes.Take):
        TAKE_OUTCOMES.labels("replayed" if result.replayed else "granted").inc()
        return {"status": 200 if result.replayed else 201, **rs.TAKE.dump(result)}
    TAKE_OUTCOMES.labels(result.code).inc()
    return {"status": result.status, **refusal_body(result)}


@bp.post("/accounts/<id>/takes/<int:take_id>/release")
@require(*PRODUCT)
@refuses(ValidationFailed, UnknownTake)
def post_account_release(id: str, take_id: int) -> Response:
    """Give a take of this account back, once: the route that names the account, which a sharded
    database routes to one shard (README "Scaling out").
    ---
    post:
      responses:
        200: {description: released, or why not, content: {application/json: {schema: ReleaseResponse}}}
    """
    return _release(take_id, account_id(id))


@bp.post("/takes/<int:take_id>/release")
@require(*PRODUCT)
@refuses(UnknownTake)
def post_release(take_id: int) -> Response:
    """Give a take's units back, once.
    ---
    post:
      responses:
        200: {description: released, or why not, content: {application/json: {schema: ReleaseResponse}}}
    """
    return _release(take_id, None)


def _release(take_id: int, account: str | None) -> Response:
    rt = runtime()
    with rt.connection() as conn:
        result = takes.release(conn, take_id=take_id, actor=actor(), account_id=account)
    RELEASES.labels("released" if result.released else str(result.reason)).inc()
    return jsonify((rs.RELEASED if result.released else rs.NOT_RELEASED).dump(result))


@bp.get("/accounts/<id>/usage")
@require(*PRODUCT)
@refuses(ValidationFailed, UnknownMetric, UnknownAccount)
def get_usage(id: str) -> Response:
    """Units used in a period; a closed period's final value comes from the ledger.
    ---
    get:
      parameters: [{in: query, schema: UsageQuery}]
      responses:
        200: {description: usage, content: {application/json: {schema: UsageResponse}}}
    """
    args = query_args(rq.USAGE_QUERY)
    rt = runtime()
    metric = args["metric"]
    accounts.require_metric(rt.plans, metric)
    current = rt.plans.period(metric)
    period = args.get("period") or current
    if not periods.same_kind(period, current):
        raise ValidationFailed(
            "the period is not of the metric's kind",
            fields={"period": [_PERIOD_OF_KIND[len(current)].format(metric=metric)]},
        )
    with rt.connection() as conn:
        used = usage.usage(conn, rt.plans, account_id=account_id(id), metric=metric, period=period)
    return jsonify(rs.USAGE.dump({"metric": metric, "period": periods.shown(period), "used": used}))


@bp.get("/accounts/<id>/usage/history")
@require(*PRODUCT)
@refuses(ValidationFailed, UnknownMetric, UnknownAccount)
def get_usage_history(id: str) -> Response:
    """Daily usage of a metric from the ledger: taken, released and the counter at each day's end.
    ---
    get:
      parameters: [{in: query, schema: UsageHistoryQuery}]
      responses:
        200:
          description: one entry per day of the range, zeros where nothing moved
          content: {application/json: {schema: UsageHistoryResponse}}
    """
    args = query_args(rq.USAGE_HISTORY_QUERY)
    rt = runtime()
    accounts.require_metric(rt.plans, args["metric"])
    with rt.connection() as conn:
        accounts.find_account(conn, account_id=account_id(id))
        days = history.daily_usage(
            conn, account_id=id, metric=args["metric"], first=args["first"], last=args["last"]
        )
    return jsonify(rs.USAGE_HISTORY.dump({"metric": args["metric"], "days": days}))


@bp.get("/accounts/<id>/grants")
@require(*PRODUCT)
@refuses(ValidationFailed, UnknownAccount)
def get_grants(id: str) -> Response:
    """The account's grants (credits), live and ended, newest first.
    ---
    get:
      parameters: [{in: query, schema: GrantsQuery}]
      responses:
        200: {description: the grants, content: {application/json: {schema: GrantsResponse}}}
    """
    args = query_args(rq.GRANTS_QUERY)
    with runtime().connection() as conn:
        accounts.find_account(conn, account_id=account_id(id))
        found = grants.list_grants(conn, account_id=id, metric=args.get("metric"))
    return jsonify(rs.GRANTS.dump({"grants": found}))


# What a usage query must name for a metric whose current period is this long (periods.py).
_PERIOD_OF_KIND = {
    len(periods.HELD): "{metric} is an allocation: it has no period; omit period for what is held now",
    len("YYYY-MM"): "{metric} resets monthly: name a month, YYYY-MM",
    len("YYYY-MM-DD"): "{metric} resets daily: name a day, YYYY-MM-DD",
}
