"""Small readers for untrusted JSON: a value of the expected type, or None."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# An escaped UTF-16 surrogate, paired or not: only a body holding one needs the slower walk below.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")


def loads(payload: str) -> Any:
    """The JSON value of `payload`, or ValueError for what the service cannot hold: not JSON; nested
    deeper than the parser's recursion limit (a RecursionError otherwise); a lone surrogate escape
    such as "\\ud800" anywhere, which Python decodes but no text column or UTF-8 encoder takes."""
    try:
        data = json.loads(payload)
    except RecursionError:
        raise ValueError("the JSON is nested too deeply") from None
    if _SURROGATE_ESCAPE.search(payload) and _has_lone_surrogate(data):
        raise ValueError("the JSON holds a lone surrogate")
    return data


def _has_lone_surrogate(value: Any) -> bool:
    stack = [value]  # not recursive: the value may be nested as deep as the parser allowed
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return True
    return False


def since_epoch(value: int | None, *, per_second: int = 1) -> datetime | None:
    """The instant `value` units (1/`per_second` s) after the Unix epoch, or None for None, a time
    before the epoch, or one past what a datetime holds (the end of year 9999)."""
    if value is None or value < 0:
        return None
    whole, part = divmod(value, per_second)
    try:
        return EPOCH + timedelta(seconds=whole, microseconds=part * 1_000_000 // per_second)
    except OverflowError:
        return None


def obj(value: Any, *path: str) -> dict[str, Any] | None:
    """The JSON object at `path` under `value`, or None."""
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, dict) else None


def text(value: Any, *path: str) -> str | None:
    """The non-empty string at `path` under `value`, or None."""
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, str) and value else None


def integer(value: Any, *path: str) -> int | None:
    """The JSON integer (not a boolean) at `path` under `value`, or None."""
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def texts(value: Any) -> tuple[str, ...]:
    """The non-empty strings of a JSON array, in order, without repeats; () for anything else."""
    if not isinstance(value, list):
        return ()
    return tuple(dict.fromkeys(v for v in value if isinstance(v, str) and v))
