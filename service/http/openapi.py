"""The OpenAPI document, assembled here and only here, from the app's routes and the marshmallow
schemas (service/http/schemas.py), by apispec with its Flask plugin.

Each view's docstring holds its operation in YAML after `---`: request body, query parameters and
the statuses it answers itself. What the routes already say is added here rather than written in
every docstring: the path parameters (from the URL rule's arguments), the key a route requires (from
`@require`: security, 401 and 403), and the summary (the docstring's first line). Metric names are
the plan config's, so the document is built per app, once, on first request.
"""

from __future__ import annotations

from typing import Any

from apispec import APISpec, BasePlugin
from apispec.ext.marshmallow import MarshmallowPlugin
from apispec.ext.marshmallow.openapi import OpenAPIConverter
from apispec_webframeworks.flask import FlaskPlugin
from flask import Flask
from marshmallow import fields

from service.http import schemas as s
from service.http.inbound import MAX_BIGINT
from service.http.runtime import Runtime

ROW_ID = {"type": "integer", "minimum": 0, "maximum": MAX_BIGINT}


def _path_parameters(metrics: list[str]) -> dict[str, dict[str, Any]]:
    """The schema of each URL rule argument, by name (every route names its ids alike)."""
    return {
        "id": {"type": "string", "pattern": s.ACCOUNT_ID.regex.pattern},
        "metric": {"type": "string", "enum": metrics},
        "take_id": ROW_ID,
        "inbox_id": ROW_ID,
    }


ERROR_RESPONSES = {
    "Error": ("refused; `error` is the code", s.Error),
    "InvalidRequest": ("validation_failed (with `fields`), unknown_metric or invalid_json", s.InvalidRequest),
    "Conflict": ("quota_exhausted, idempotency_key_reused or customer_already_linked", s.Conflict),
}


class _RoutePlugin(BasePlugin):
    """What every operation takes from its view: summary, and the role `@require` asks for."""

    def operation_helper(
        self, path: str | None = None, operations: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        view = kwargs["view"]
        roles: tuple[str, ...] | None = getattr(view, "roles", None)
        summary = (view.__doc__ or "").strip().splitlines()[0]
        for op in (operations or {}).values():
            op.setdefault("summary", summary)
            if roles:
                op["description"] = f"Role: {' or '.join(roles)}."
                op["security"] = [{"apiKey": []}]
                op["responses"].setdefault(401, "Error")
                op["responses"].setdefault(403, "Error")
            else:
                op.setdefault("security", [])


def _field_rules(metrics: list[str]) -> Any:
    """What our field classes refuse beyond their type: Text a NUL (which Postgres cannot store),
    Metric a name the plan config does not know."""

    def field_rules(self: OpenAPIConverter, field: fields.Field[Any], **kwargs: Any) -> dict[str, Any]:
        rules: dict[str, Any] = {}
        if isinstance(field, s.Text):
            rules["pattern"] = "^[^\\u0000]*$"
        if isinstance(field, s.Metric):
            rules["enum"] = metrics
        return rules

    return field_rules


def build(app: Flask) -> dict[str, Any]:
    rt: Runtime = app.extensions["quota"]
    metrics = list(rt.plans.metrics)
    marshmallow = MarshmallowPlugin()
    spec = APISpec(
        title="Quota ledger",
        version="1.0.0",
        openapi_version="3.0.3",
        plugins=[FlaskPlugin(), _RoutePlugin(), marshmallow],
        info={"description": "Plan limits from billing webhooks, atomic takes, an append-only ledger."},
    )
    assert marshmallow.converter is not None
    marshmallow.converter.add_attribute_function(_field_rules(metrics))  # type: ignore[no-untyped-call]
    spec.components.security_scheme("apiKey", {"type": "http", "scheme": "bearer"})
    spec.components.security_scheme(
        "revenuecatAuthorization", {"type": "apiKey", "in": "header", "name": "Authorization"}
    )
    for name, (description, schema) in ERROR_RESPONSES.items():
        spec.components.response(
            name, {"description": description, "content": {"application/json": {"schema": schema}}}
        )
    by_name = _path_parameters(metrics)
    for rule in sorted(app.url_map.iter_rules(), key=lambda r: r.rule):
        if rule.endpoint == "static":
            continue
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
