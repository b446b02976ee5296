"""API-key authentication with roles. A missing or unknown key is 401, a key of the wrong role 403."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import wraps
from typing import ParamSpec, TypeVar

from flask import g, request

from service.http import metrics
from service.http.errors import Forbidden, Unauthorized
from service.http.runtime import runtime
from service.keys import KeyOwner, hash_key, verify_key_hash
from service.vocabulary import Role

P = ParamSpec("P")
R = TypeVar("R")

# Per-process cache of verified keys: saves a query per request; a revoked key keeps working for at
# most KEY_CACHE_SECONDS here. A rotated key is cached no longer than its grace has left (the
# database's clock decides), so it stops when the grace ends. Unknown keys are not cached, so a new
# key works at once.
_cache: dict[bytes, tuple[KeyOwner, float]] = {}


def authenticate() -> KeyOwner:
    header = request.headers.get("Authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthorized("send Authorization: Bearer <api key>")
    owner = key_owner(hash_key(key.strip()))
    if owner is None:
        raise Unauthorized("unknown, revoked or expired API key (a rotated key ends with its grace)")
    return owner


def key_owner(digest: bytes) -> KeyOwner | None:
    """The owner of the key whose hash is `digest`, through the cache; None: unknown, revoked or
    expired. The console checks its sessions' keys here too, so a revoked key ends them within
    KEY_CACHE_SECONDS as it stops the API."""
    now = time.monotonic()
    hit = _cache.get(digest)
    if hit and hit[1] > now:
        metrics.KEY_CACHE_HIT.inc()
        return hit[0]
    metrics.KEY_CACHE_MISS.inc()
    rt = runtime()
    with rt.connection() as conn:
        owner = verify_key_hash(conn, digest)
    if owner is None:
        _cache.pop(digest, None)
        return None
    if len(_cache) > 10_000:
        _cache.clear()
    ttl = rt.settings.key_cache_seconds
    if owner.expires_in is not None:
        ttl = min(ttl, owner.expires_in)
    _cache[digest] = (owner, now + ttl)
    return owner


def require(*roles: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Allow only keys whose role is one of `roles` (each a Role: a name that is none is refused
    when the view is defined); the key's owner is `g.key`."""
    for role in roles:
        Role(role)

    def decorate(view: Callable[P, R]) -> Callable[P, R]:
        @wraps(view)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            owner = authenticate()
            if owner.role not in roles:
                raise Forbidden(f"this needs a key with role {' or '.join(roles)}")
            g.key = owner
            return view(*args, **kwargs)

        wrapper.roles = roles  # type: ignore[attr-defined]  # read by the OpenAPI builder
        return wrapper

    return decorate


def actor() -> str:
    """Who is acting, for ledger and audit rows: the API key's name."""
    owner: KeyOwner = g.key
    return owner.name
