"""API keys: random 256-bit secrets, stored only as their SHA-256, each with a name and a role.

A fast hash is the right one here: the keys are random, not passwords, so there is nothing to
brute-force, and every request verifies one.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from service.db import Connection

ROLES = ("product", "admin", "finance")
PREFIX = "qlk_"


@dataclass(frozen=True)
class KeyOwner:
    name: str
    role: str


def hash_key(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def create_key(conn: Connection, *, name: str, role: str) -> str:
    """Create a key; returns the secret, which is shown once and never stored.
    A live key with the same name must be revoked first (psycopg raises UniqueViolation)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}")
    key = PREFIX + secrets.token_urlsafe(32)
    conn.execute(
        "INSERT INTO api_keys (name, role, key_hash) VALUES (%s, %s, %s)", (name, role, hash_key(key))
    )
    return key


def reissue_key(conn: Connection, *, name: str, role: str) -> str:
    """Replace every key called `name`, live or revoked, by a new one; returns its secret. For
    `dev`, which issues its keys on every start and needs no trail of the ones it replaced."""
    with conn.transaction():
        conn.execute("DELETE FROM api_keys WHERE name = %s", (name,))
        return create_key(conn, name=name, role=role)


def revoke_key(conn: Connection, *, name: str) -> bool:
    """Revoke the live key called `name`; False if there was none."""
    cur = conn.execute(
        "UPDATE api_keys SET revoked_at = now() WHERE name = %s AND revoked_at IS NULL", (name,)
    )
    return cur.rowcount > 0


def verify_key(conn: Connection, key: str) -> KeyOwner | None:
    """The owner of a live key, or None."""
    row = conn.execute(
        "SELECT name, role FROM api_keys WHERE key_hash = %s AND revoked_at IS NULL", (hash_key(key),)
    ).fetchone()
    return KeyOwner(str(row[0]), str(row[1])) if row else None


def list_keys(conn: Connection) -> list[tuple[str, str, str, str | None]]:
    rows = conn.execute(
        "SELECT name, role, created_at::text, revoked_at::text FROM api_keys ORDER BY id"
    ).fetchall()
    return [(str(r[0]), str(r[1]), str(r[2]), None if r[3] is None else str(r[3])) for r in rows]
