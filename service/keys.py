"""API keys: random 256-bit secrets, stored only as their SHA-256, each with a name and a role.

A fast hash is the right one here: the keys are random, not passwords, so there is nothing to
brute-force, and every request verifies one. A name has one live key; rotating it issues the next
one and gives the keys it replaces an end (their grace), so a service rolls its key without a gap.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from psycopg.rows import class_row, dict_row

from service import audit
from service.db import Connection, Q, transaction
from service.vocabulary import Role

ROLES = tuple(Role)
PREFIX = "qlk_"


@dataclass(frozen=True)
class KeyOwner:
    """Who a verified key belongs to; `expires_in`: the seconds left to a rotated key's grace (None:
    it has no end)."""

    name: str
    role: str
    expires_in: float | None = None


def hash_key(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


@dataclass(frozen=True)
class KeyListing:
    name: str
    role: str
    created_at: str
    revoked_at: str | None
    expires_at: str | None
    expired: bool | None


@dataclass(frozen=True)
class Rotation:
    """A rotation's outcome: the new key's secret (shown once) and until when the old one is accepted."""

    key: str
    role: str
    old_until: datetime


def _new_secret() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def create_key(conn: Connection, *, name: str, role: str, actor: str = "cli") -> str:
    """Create a key; returns the secret, which is shown once and never stored. Audited as `actor`
    (who ran the command). A live key with the same name must be revoked first (psycopg raises
    UniqueViolation)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}")
    key = _new_secret()
    with transaction(conn):
        conn.execute(Q.key_insert, {"name": name, "role": role, "key_hash": hash_key(key)})
        audit.record(conn, actor=actor, action="key_created", old=None, new={"name": name, "role": role})
    return key


def reissue_key(conn: Connection, *, name: str, role: str, actor: str) -> str:
    """Replace every key called `name`, live or revoked, by a new one; returns its secret. For
    `dev`, which issues its keys on every start and needs no trail of the ones it replaced (the new
    key's creation is audited as `actor`)."""
    with transaction(conn):
        conn.execute(Q.key_delete, {"name": name})
        return create_key(conn, name=name, role=role, actor=actor)


def rotate_key(conn: Connection, *, name: str, grace: timedelta, actor: str = "cli") -> Rotation | None:
    """Issue a new key for the live key `name`, with its role, and keep the key it replaces accepted
    for `grace` more (a key rotated earlier keeps its own end if that comes sooner); None if `name`
    has no live key. Audited as `actor` (`key_rotated`)."""
    if grace < timedelta(0):
        raise ValueError("a grace period is not negative")
    key = _new_secret()
    with transaction(conn), conn.cursor(row_factory=dict_row) as cur:
        live = cur.execute(Q.key_live, {"name": name, "grace": grace}).fetchone()
        if live is None:
            return None
        role, until = live["role"], live["old_until"]
        cur.execute(Q.key_expire, {"name": name, "until": until})
        cur.execute(Q.key_insert, {"name": name, "role": role, "key_hash": hash_key(key)})
        audit.record(
            conn,
            actor=actor,
            action="key_rotated",
            old={"name": name, "role": role, "old_key_until": None},
            new={"name": name, "role": role, "old_key_until": until.isoformat()},
        )
    return Rotation(key=key, role=role, old_until=until)


def revoke_key(conn: Connection, *, name: str, actor: str = "cli") -> bool:
    """Revoke every key called `name` still accepted (the live one and any rotated one in its grace),
    audited as `actor`; False if there was none."""
    with transaction(conn), conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(Q.key_revoke, {"name": name}).fetchall()
        if not rows:
            return False
        row = next((r for r in rows if r["live"]), rows[0])
        audit.record(
            conn,
            actor=actor,
            action="key_revoked",
            old={"name": name, "role": row["role"], "revoked": False},
            new={"name": name, "role": row["role"], "revoked": True},
        )
    return True


def verify_key(conn: Connection, key: str) -> KeyOwner | None:
    """The owner of a key still accepted (live, or rotated and in its grace), or None."""
    return verify_key_hash(conn, hash_key(key))


def verify_key_hash(conn: Connection, key_hash: bytes) -> KeyOwner | None:
    """verify_key by the key's hash (hash_key): what a console session keeps instead of the key."""
    with conn.cursor(row_factory=class_row(KeyOwner)) as cur:
        return cur.execute(Q.key_verify, {"key_hash": key_hash}).fetchone()


def list_keys(conn: Connection) -> list[KeyListing]:
    with conn.cursor(row_factory=class_row(KeyListing)) as cur:
        return cur.execute(Q.key_list).fetchall()
