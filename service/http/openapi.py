"""The OpenAPI document, assembled here and only here, from the app's routes and the marshmallow
schemas (service/http/schemas/), by apispec with its Flask plugin.

Each view's docstring holds its operation in YAML after `---`: request body, query parameters and
the answers that are not refusals. What the routes already say is added here rather than written in
every docstring: the path parameters (from the URL rule's arguments), the key a route requires (from
`@require`: security, 401 and 403), the refusals it declares (`@refuses`: each status with its codes
and their meaning), and the summary (the docstring's first line). Metric names are the plan
config's, and so are feature names, so the document is built per app, once, on first request.
"""

from __future__ import annotations

from typing import Any

from apispec import APISpec, BasePlugin
from apispec.ext.marshmallow import MarshmallowPlugin
from apispec.ext.marshmallow.openapi import OpenAPIConverter
from apispec_webframeworks.flask import FlaskPlugin
from flask import Flask
from marshmallow import Schema, fields

from service.errors import IdempotencyKeyReused, InvalidUrl, QuotaExhausted
from service.http.errors import EVERY_ROUTE, Forbidden, NotFound, Refusal, Unauthorized, ValidationFailed
from service.http.inbound import MAX_BIGINT
from service.http.runtime import Runtime
from service.http.schemas import requests as rq
from service.http.schemas import responses as rs
from service.http.schemas.fields import ConsumableMetric, Feature, IdempotencyKey, Metric, Text
from service.vocabulary import ACCOUNT_ID_PATTERN, MetricKind

ROW_ID = {"type": "integer", "minimum": 0, "maximum": MAX_BIGINT}


def _names(names: list[str]) -> dict[str, Any]:
    """The plan config's names (of metrics, of features) as a string enum; any string when it has none."""
    return {"type": "string", "enum": names} if names else {"type": "string"}


def _path_parameters(metrics: list[str], features: list[str]) -> dict[str, dict[str, Any]]:
    """The schema of each URL rule argument, by name (every route names its ids alike)."""
    return {
        "id": {"type": "string", "pattern": ACCOUNT_ID_PATTERN},
        "metric": _names(metrics),
        "feature": _names(features),
        "take_id": ROW_ID,
        "grant_id": ROW_ID,
        "inbox_id": ROW_ID,
        "delivery_id": ROW_ID,
        "endpoint_id": {"type": "string", "minLength": 1, "maxLength": 128},
    }


# The refusals whose body carries more than `error` and `message`; the others answer rs.Error.
BODIES: dict[Refusal, type[Schema]] = {
    ValidationFailed: rs.InvalidRequest,  # `fields`
    InvalidUrl: rs.InvalidEndpoint,  # `reason`
    QuotaExhausted: rs.Conflict,  # the counter as it stood
    IdempotencyKeyReused: rs.Conflict,  # the earlier take
}


def _refusal_responses(refusals: list[Refusal]) -> dict[int, dict[str, Any]]:
    """One response per status: its codes (an enum, so a client and schemathesis can hold the
    service to them) and what each means (the error's docstring)."""
    by_status: dict[int, list[Refusal]] = {}
    for r in refusals:
        if r not in by_status.setdefault(r.status, []):
            by_status[r.status].append(r)
    responses = {}
    for status, group in sorted(by_status.items()):
        # they extend Error; of two, the one that extends the other (InvalidEndpoint: InvalidRequest)
        body = max((BODIES[r] for r in group if r in BODIES), key=lambda b: len(b.__mro__), default=rs.Error)
        lines = [f"`{r.code}`: {' '.join((r.__doc__ or '').split())}" for r in group]
        codes = sorted({r.code for r in group})
        response: dict[str, Any] = {
            "description": "\n".join(lines if len(lines) == 1 else [f"- {line}" for line in lines]),
        }
        if not all(getattr(r, "bodiless", False) for r in group):
            schema = {"allOf": [body, {"type": "object", "properties": {"error": {"enum": codes}}}]}
            response["content"] = {"application/json": {"schema": schema}}
        responses[status] = response
    return responses


class _RoutePlugin(BasePlugin):
    """What every operation takes from its view: summary, the role `@require` asks for, and the
    refusals it declares (`@refuses`), with every route's."""

    def operation_helper(
        self, path: str | None = None, operations: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        view = kwargs["view"]
        roles: tuple[str, ...] | None = getattr(view, "roles", None)
        refusals: list[Refusal] = list(getattr(view, "refuses", ()))
        if "{" in (path or ""):
            refusals.append(NotFound)  # a path argument that no rule accepts names no route
        if roles:
            refusals += [Unauthorized, Forbidden]
        refusals += EVERY_ROUTE
        summary = (view.__doc__ or "").strip().splitlines()[0]
        for op in (operations or {}).values():
            op.setdefault("summary", summary)
            if roles:
                op["description"] = f"Role: {' or '.join(roles)}."
                op["security"] = [{"apiKey": []}]
            else:
                op.setdefault("security", [])
            for status, response in _refusal_responses(refusals).items():
                if status in op["responses"]:
                    raise ValueError(f"{path}: {status} is answered by a refusal; declare it with @refuses")
                op["responses"][status] = response
            op["responses"] = dict(sorted(op["responses"].items(), key=lambda item: int(item[0])))


def _field_rules(metrics: list[str], features: list[str], consumables: list[str]) -> Any:
    """What our field classes refuse beyond their type: Text a NUL (which Postgres cannot store),
    Metric and Feature a name the plan config does not know (ConsumableMetric: an allocation's too)."""

    def field_rules(self: OpenAPIConverter, field: fields.Field[Any], **kwargs: Any) -> dict[str, Any]:
        rules: dict[str, Any] = {}
        if isinstance(field, IdempotencyKey):
            rules["pattern"] = "^[^\\u0000\\u001f]*$"
        elif isinstance(field, Text):
            rules["pattern"] = "^[^\\u0000]*$"
        if isinstance(field, Metric):
            rules["enum"] = consumables if isinstance(field, ConsumableMetric) else metrics
        if isinstance(field, Feature) and features:
            rules["enum"] = features
        return rules

    return field_rules


def build(app: Flask) -> dict[str, Any]:
    rt: Runtime = app.extensions["quota"]
    metrics, features = list(rt.plans.metrics), list(rt.plans.features)
    marshmallow = MarshmallowPlugin()
    spec = APISpec(
        title="Quota ledger",
        version="1.0.0",
        openapi_version="3.0.3",
        plugins=[FlaskPlugin(), _RoutePlugin(), marshmallow],
        info={"description": "Plan limits from billing webhooks, atomic takes, an append-only ledger."},
    )
    assert marshmallow.converter is not None
    consumables = [m for m in metrics if rt.plans.metric(m).kind == MetricKind.CONSUMABLE]
    marshmallow.converter.add_attribute_function(_field_rules(metrics, features, consumables))  # type: ignore[no-untyped-call]
    spec.components.security_scheme("apiKey", {"type": "http", "scheme": "bearer"})
    spec.components.security_scheme(
        "revenuecatAuthorization", {"type": "apiKey", "in": "header", "name": "Authorization"}
    )
    # A batch's items are validated one by one (a bad one is its own 422 result), so the request's
    # schema says only "objects"; what each should be is this component, named in its description.
    spec.components.schema("TakeItem", schema=rq.TakeItem)
    by_name = _path_parameters(metrics, features)
    for rule in sorted(app.url_map.iter_rules(), key=lambda r: r.rule):
        if rule.endpoint == "static" or rule.endpoint.startswith("console."):
            continue  # the console's pages are HTML for people, not the API (docs/console.md)
        parameters = [
            {"name": arg, "in": "path", "required": True, "schema": by_name[arg]}
            for arg in sorted(rule.arguments)
        ]
        spec.path(view=app.view_functions[rule.endpoint], app=app, parameters=parameters)
    return spec.to_dict()


def openapi_document(app: Flask) -> dict[str, Any]:
    doc: dict[str, Any] | None = app.extensions.get("openapi")
    if doc is None:
        doc = app.extensions["openapi"] = build(app)
    return doc
