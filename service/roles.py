"""The login roles the service runs as. Web, worker and beat: a member of `quota_app` (migration
0001), which reads the ledger and the audit log and appends to them only through the service's own
operations (the definer functions of migrations/repeatable/), never changes or deletes a row, nor
disables their triggers (only the owner of the tables, the role `migrate` runs as, may alter them).
The relay: a member of `quota_relay` (migration 0028), which is quota_app and may also read the
webhook endpoints' signing secrets, which quota_app may not."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
from psycopg import sql

APP_GROUP = "quota_app"
RELAY_GROUP = "quota_relay"


def ensure_login_role(
    owner_url: str, name: str, password: str | None = None, *, group: str = APP_GROUP
) -> None:
    """Create the login role `name` as a member of `group` (APP_GROUP or RELAY_GROUP), or bring an
    existing one in line (LOGIN, the member, the password when one is given; a service role, one of
    APP_GROUP, loses RELAY_GROUP if it had it: a login once shared with the relay must not keep the
    secrets). Run it as the owner, after the migrations. Roles belong to the whole cluster: several
    processes may run this at once, so losing the race to create the role, or to change it, is
    retried rather than refused."""
    if group not in (APP_GROUP, RELAY_GROUP):
        raise ValueError(f"a login role joins {APP_GROUP} or {RELAY_GROUP}, not {group!r}")
    role, group_id = sql.Identifier(name), sql.Identifier(group)
    secret = sql.SQL(" PASSWORD {}").format(sql.Literal(password)) if password else sql.SQL("")
    with psycopg.connect(owner_url, autocommit=True) as conn:
        for attempt in range(10):
            try:
                exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone()
                if not exists:
                    conn.execute(sql.SQL("CREATE ROLE {} LOGIN{} IN ROLE {}").format(role, secret, group_id))
                else:
                    conn.execute(sql.SQL("ALTER ROLE {} LOGIN{}").format(role, secret))
                    conn.execute(sql.SQL("GRANT {} TO {}").format(group_id, role))
                    if group == APP_GROUP and _member_of(conn, name, RELAY_GROUP):
                        conn.execute(sql.SQL("REVOKE {} FROM {}").format(sql.Identifier(RELAY_GROUP), role))
                return
            except (
                psycopg.errors.DuplicateObject,  # created by another process since we looked
                psycopg.errors.UniqueViolation,  # the same race, caught by the catalog's index
                psycopg.errors.InternalError_,  # "tuple concurrently updated": a concurrent ALTER
            ):
                if attempt == 9:
                    raise
                time.sleep(0.05 * (attempt + 1))


def _member_of(conn: psycopg.Connection[Any], name: str, group: str) -> bool:
    """Whether `name` is a direct member of `group` (one that exists)."""
    row = conn.execute(
        "SELECT EXISTS (SELECT FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid"
        " JOIN pg_roles r ON r.oid = m.member WHERE g.rolname = %s AND r.rolname = %s)",
        (group, name),
    ).fetchone()
    return bool(row and row[0])


def as_login(url: str, name: str, password: str | None = None) -> str:
    """`url` with the user (and password) replaced: the same server and database, another role."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    auth = quote(name, safe="") + (":" + quote(password, safe="") if password else "")
    return urlunsplit(parts._replace(netloc=f"{auth}@{host}"))
