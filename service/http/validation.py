"""Request bodies and arguments through marshmallow: 400 for a body that is not a JSON object,
422 with per-field messages for anything the schema refuses (unknown fields included)."""

from __future__ import annotations

import json
from typing import Any

from flask import request
from marshmallow import Schema, ValidationError

from service.http.errors import InvalidJson, ValidationFailed
from service.http.schemas.fields import ACCOUNT_ID
from service.vocabulary import ACCOUNT_ID_RULE


def json_body(schema: Schema) -> dict[str, Any]:
    return load(schema, json_object())


def json_object() -> dict[str, Any]:
    """The request's body, a JSON object (else InvalidJson), not yet validated."""
    raw = request.get_data()
    try:
        data = json.loads(raw) if raw else None  # whatever its Content-Type says
    except (ValueError, RecursionError):  # not JSON (or not UTF-8), or nested deeper than the parser goes
        data = None
    if not isinstance(data, dict):
        raise InvalidJson("the body must be a JSON object")
    return data


def query_args(schema: Schema) -> dict[str, Any]:
    return load(schema, request.args.to_dict())


def load(schema: Schema, data: dict[str, Any]) -> dict[str, Any]:
    try:
        loaded: dict[str, Any] = schema.load(data)
    except ValidationError as e:
        raise ValidationFailed("the request is not valid", fields=_by_path(e.messages)) from None
    return loaded


def _by_path(messages: Any, prefix: str = "") -> dict[str, list[str]]:
    """The messages per field, a nested one's named by its path (`lines.0.units`), so that `fields`
    keeps one shape: a list of messages per name."""
    if not isinstance(messages, dict):
        return {prefix.rstrip("."): list(messages) if isinstance(messages, list) else [str(messages)]}
    out: dict[str, list[str]] = {}
    for name, inner in messages.items():
        out.update(_by_path(inner, f"{prefix}{name}."))
    return out


def account_id(value: str) -> str:
    try:
        return str(ACCOUNT_ID(value))
    except ValidationError:
        raise ValidationFailed("invalid account id", fields={"id": [ACCOUNT_ID_RULE]}) from None
