"""Field types and patterns of the API's bodies: what a field accepts beyond its JSON type (whole-string
patterns, strict integers, text PostgreSQL can store, the plan config's metric names)."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any, cast

from marshmallow import ValidationError, fields, validate

from service.quota import periods
from service.vocabulary import ACCOUNT_ID_PATTERN, ACCOUNT_ID_RULE

MAX_UNITS = 2**31 - 1


def one_of(words: type[StrEnum], *more: str) -> validate.OneOf:
    """A validator that takes the values of `words` (and `more`), listed in the document as an enum."""
    return validate.OneOf([*more, *(w.value for w in words)])


class Whole(validate.Regexp):
    """A pattern the whole string must match. Written `^...$` as JSON Schema reads it (the document
    quotes it), applied with fullmatch() because Python's `$` also matches before a trailing newline,
    which the database would then refuse."""

    def __call__(self, value: Any) -> Any:
        regex = cast("re.Pattern[str]", self.regex)
        if not isinstance(value, str) or regex.fullmatch(value) is None:
            raise ValidationError(self._format_error(value))
        return value


ACCOUNT_ID = Whole(ACCOUNT_ID_PATTERN, error=ACCOUNT_ID_RULE)
PERIOD = Whole(periods.PERIOD_RE, error="a calendar month, YYYY-MM")
USAGE_PERIOD = Whole(periods.MONTH_OR_DAY_RE, error="a calendar month YYYY-MM, or a day YYYY-MM-DD")
LEDGER_PERIOD = Whole(
    periods.LEDGER_PERIOD_RE,
    error="a calendar month YYYY-MM (with its days), a day YYYY-MM-DD, or held (allocations)",
)
CURSOR = Whole(r"^[0-9]{1,18}$", error="a cursor from next_cursor")


class StrictInt(fields.Integer):
    """A JSON integer only: no strings, floats or booleans (bool is an int in Python)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(strict=True, **kwargs)

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValidationError("Not a valid integer.")
        return super()._deserialize(value, attr, data, **kwargs)


class StrictBool(fields.Boolean):
    """A JSON boolean only: no 1, "true" or "yes"."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        if not isinstance(value, bool):
            raise ValidationError("Not a valid boolean.")
        return value


class Text(fields.String):
    """A string Postgres can store: JSON allows NUL characters and lone surrogates, text columns do not."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        text = super()._deserialize(value, attr, data, **kwargs)
        if "\x00" in text:
            raise ValidationError("Must not contain NUL characters.")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ValidationError("Not valid Unicode (lone surrogate).") from None
        return text


class IdempotencyKey(Text):
    """A client's idempotency key: 1-255 characters, none of them U+001F, which separates the keys of a
    multi-line take's lines (take_line_key, migrations/repeatable/ledger_writers.sql)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(validate=validate.Length(min=1, max=255), **kwargs)

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        key = super()._deserialize(value, attr, data, **kwargs)
        if LINE_SEPARATOR in key:
            raise ValidationError("Must not contain U+001F (it separates a multi-line take's lines).")
        return key


LINE_SEPARATOR = "\x1f"


class Metric(Text):
    """A metric's name. Which names exist is the plan config's, read at run time: an unknown one is
    the domain's UnknownMetric (422 unknown_metric), and the document lists the config's as an enum."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(validate=validate.Length(min=1, max=64), **kwargs)


class ConsumableMetric(Metric):
    """A consumable metric's name (a grant's): the document lists the config's consumables; an
    allocation is the domain's NotGrantable (422 not_grantable)."""


class Feature(Text):
    """A boolean feature's name: as Metric, the plan config's (UnknownFeature, 422 unknown_feature),
    listed in the document as an enum."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(validate=validate.Length(min=1, max=64), **kwargs)
