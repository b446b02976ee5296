"""API keys: random 256-bit secrets, stored only as their SHA-256, each with a name and a role.

A fast hash is the right one here: the keys are random, not passwords, so there is nothing to
brute-force, and every request verifies one.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from psycopg.types.json import Jsonb

from service.db import Connection, Q, transaction

ROLES = ("product", "admin", "finance")
PREFIX = "qlk_"


@dataclass(frozen=True)
class KeyOwner:
    name: str
    role: str


def hash_key(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def _audit(conn: Connection, *, actor: str, action: str, old: object, new: object) -> None:
    conn.execute(
        Q.audit,
        {
            "actor": actor,
            "action": action,
            "account_id": "",
            "metric": None,
            "old": Jsonb(old),
            "new": Jsonb(new),
        },
    )


def create_key(conn: Connection, *, name: str, role: str, actor: str = "cli") -> str:
    """Create a key; returns the secret, which is shown once and never stored. Audited as `actor`
    (who ran the command). A live key with the same name must be revoked first (psycopg raises
    UniqueViolation)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}")
    key = PREFIX + secrets.token_urlsafe(32)
    with transaction(conn):
        conn.execute(
            "INSERT INTO api_keys (name, role, key_hash) VALUES (%s, %s, %s)", (name, role, hash_key(key))
        )
        _audit(conn, actor=actor, action="key_created", old=None, new={"name": name, "role": role})
    return key


def reissue_key(conn: Connection, *, name: str, role: str, actor: str) -> str:
    """Replace every key called `name`, live or revoked, by a new one; returns its secret. For
    `dev`, which issues its keys on every start and needs no trail of the ones it replaced (the new
    key's creation is audited as `actor`)."""
    with transaction(conn):
        conn.execute("DELETE FROM api_keys WHERE name = %s", (name,))
        return create_key(conn, name=name, role=role, actor=actor)


def revoke_key(conn: Connection, *, name: str, actor: str = "cli") -> bool:
    """Revoke the live key called `name`, audited as `actor`; False if there was none."""
    with transaction(conn):
        row = conn.execute(
            "UPDATE api_keys SET revoked_at = now() WHERE name = %s AND revoked_at IS NULL RETURNING role",
            (name,),
        ).fetchone()
        if row is None:
            return False
        _audit(
            conn,
            actor=actor,
            action="key_revoked",
            old={"name": name, "role": row[0], "revoked": False},
            new={"name": name, "role": row[0], "revoked": True},
        )
    return True


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
