"""Small readers for untrusted JSON: a value of the expected type, or None."""

from __future__ import annotations

from typing import Any


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
