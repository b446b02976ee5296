"""API keys: random 256-bit secrets, stored only as their SHA-256, each with a name and a role.

A fast hash is the right one here: the keys are random, not passwords, so there is nothing to
brute-force, and every request verifies one.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from psycopg.rows import class_row, dict_row

from service import audit
from service.db import Connection, Q, transaction
from service.vocabulary import Role

ROLES = tuple(Role)
PREFIX = "qlk_"


@dataclass(frozen=True)
class KeyOwner:
    name: str
    role: str


def hash_key(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


@dataclass(frozen=True)
class KeyListing:
    name: str
    role: str
    created_at: str
    revoked_at: str | None


def create_key(conn: Connection, *, name: str, role: str, actor: str = "cli") -> str:
    """Create a key; returns the secret, which is shown once and never stored. Audited as `actor`
    (who ran the command). A live key with the same name must be revoked first (psycopg raises
    UniqueViolation)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}")
    key = PREFIX + secrets.token_urlsafe(32)
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


def revoke_key(conn: Connection, *, name: str, actor: str = "cli") -> bool:
    """Revoke the live key called `name`, audited as `actor`; False if there was none."""
    with transaction(conn), conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q.key_revoke, {"name": name}).fetchone()
        if row is None:
            return False
        audit.record(
            conn,
            actor=actor,
            action="key_revoked",
            old={"name": name, "role": row["role"], "revoked": False},
            new={"name": name, "role": row["role"], "revoked": True},
        )
    return True


def verify_key(conn: Connection, key: str) -> KeyOwner | None:
    """The owner of a live key, or None."""
    with conn.cursor(row_factory=class_row(KeyOwner)) as cur:
        return cur.execute(Q.key_verify, {"key_hash": hash_key(key)}).fetchone()


def list_keys(conn: Connection) -> list[KeyListing]:
    with conn.cursor(row_factory=class_row(KeyListing)) as cur:
        return cur.execute(Q.key_list).fetchall()
