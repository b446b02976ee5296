"""Request bodies and arguments through marshmallow: 400 for a body that is not a JSON object,
422 with per-field messages for anything the schema refuses (unknown fields included)."""

from __future__ import annotations

import re
from typing import Any

from flask import request
from marshmallow import Schema, ValidationError

from service.http.errors import ApiError

_ACCOUNT_ID = re.compile(r"^[A-Za-z0-9._:@-]{1,128}$")


def json_body(schema: Schema) -> dict[str, Any]:
    data = request.get_json(silent=True, force=True) if request.get_data() else None
    if not isinstance(data, dict):
        raise ApiError(400, "invalid_json", "the body must be a JSON object")
    return load(schema, data)


def query_args(schema: Schema) -> dict[str, Any]:
    return load(schema, request.args.to_dict())


def load(schema: Schema, data: dict[str, Any]) -> dict[str, Any]:
    try:
        loaded: dict[str, Any] = schema.load(data)
    except ValidationError as e:
        raise ApiError(422, "validation_failed", "the request is not valid", fields=e.messages) from None
    return loaded


def account_id(value: str) -> str:
    if not _ACCOUNT_ID.fullmatch(value):  # not .match: `$` would let a trailing newline through
        raise ApiError(
            422,
            "validation_failed",
            "invalid account id",
            fields={"id": ["1-128 characters of [A-Za-z0-9._:@-]"]},
        )
    return value
