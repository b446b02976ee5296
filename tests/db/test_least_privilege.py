"""The service runs as a login role that is a member of quota_app, never as the owner of the tables:
the app and worker fixtures connect as one (tests/conftest.py `app_db_url`), so every HTTP, webhook
and worker test exercises these grants. Here: the app really connects as it, the role is created
safely, and every table is granted. What it may not do to the ledger: test_append_only.py."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from service.events import endpoints
from service.events.relay import CannotSign, check_can_sign
from service.roles import RELAY_GROUP, as_login, ensure_login_role


def test_the_app_connects_as_the_login_role(app):
    with app.extensions["quota"].connection() as conn:
        user, superuser = conn.execute(
            "SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
    assert user == "quota_ledger_test" and superuser is False


def test_ensure_login_role_is_idempotent_and_sets_the_password(pg_url, db_url, app_role):
    name, password = app_role
    ensure_login_role(pg_url, name, password)  # a second time: no error
    with psycopg.connect(as_login(db_url, name, password), autocommit=True) as c:
        assert c.execute("SELECT current_user").fetchone() == (name,)


def test_ensure_login_role_is_race_safe(pg_url, template_db):
    """Other test runs and deployments create roles on the same cluster at the same time."""
    name = f"ql_race_{uuid.uuid4().hex[:8]}"
    try:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: ensure_login_role(pg_url, name, f"pw{i}"), range(16)))
        with psycopg.connect(pg_url, autocommit=True) as c:
            assert c.execute("SELECT pg_has_role(%s, 'quota_app', 'MEMBER')", (name,)).fetchone() == (True,)
    finally:
        with psycopg.connect(pg_url, autocommit=True) as c:
            c.execute(f'DROP ROLE IF EXISTS "{name}"')


@pytest.mark.parametrize(
    "option, password_variable, group, signs",
    [
        ("--login-role", "LOGIN_ROLE_PASSWORD", "quota_app", False),
        ("--relay-role", "RELAY_ROLE_PASSWORD", RELAY_GROUP, True),
    ],
)
def test_migrate_creates_the_login_role_it_is_given(db_url, pg_url, option, password_variable, group, signs):
    """As compose runs it: `migrate --login-role NAME` (the service's) or `--relay-role NAME` (the
    relay's, which alone reads the signing secrets) as the owner, the password from the environment."""
    name = f"ql_login_{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "DATABASE_URL": db_url, password_variable: "s3cr3t"}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "service.cli", "migrate", option, name],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        with psycopg.connect(as_login(db_url, name, "s3cr3t"), autocommit=True) as c:
            row = c.execute(
                "SELECT current_user, pg_has_role(current_user, %s, 'MEMBER'),"
                " pg_has_role(current_user, 'quota_app', 'MEMBER')",
                (group,),
            ).fetchone()
            assert row == (name, True, True)
            if signs:
                check_can_sign(c)
            else:
                with pytest.raises(CannotSign):
                    check_can_sign(c)
    finally:
        with psycopg.connect(pg_url, autocommit=True) as c:
            c.execute(f'DROP ROLE IF EXISTS "{name}"')


def test_every_table_is_granted_to_quota_app(conn):
    """A migration that adds a table grants quota_app what the service needs on it (at least SELECT,
    of the table or of some of its columns: webhook_endpoints' secrets are the relay's alone); the
    service never runs as the owner, so a forgotten grant fails in production only."""
    missing = conn.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm')"
        " AND c.relname NOT LIKE '%yoyo%' AND NOT has_any_column_privilege('quota_app', c.oid, 'SELECT')"
    ).fetchall()
    assert missing == []


def test_only_the_relay_role_reads_the_signing_secrets(conn, app_db_url, relay_db_url):
    """The web process (quota_app) lists endpoints but cannot read a secret, so it cannot sign an
    event; the relay (quota_relay) can. Create and rotate hand a secret to the owner's functions."""
    created = endpoints.create(
        conn, url="http://127.0.0.1:9/hook", events=["quota.threshold_crossed"], allow_private=True, actor="t"
    )
    with psycopg.connect(app_db_url, autocommit=True) as web:
        assert [e.id for e in endpoints.list_endpoints(web)] == [created.id]
        for column in ("secret", "previous_secret", "*"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                web.execute(f"SELECT {column} FROM webhook_endpoints")
        with pytest.raises(CannotSign, match="quota_relay"):
            check_can_sign(web)
        rotated = endpoints.rotate(web, endpoint_id=created.id, actor="test")  # through the owner's function
    with psycopg.connect(relay_db_url, autocommit=True) as relay:
        check_can_sign(relay)
        row = relay.execute("SELECT secret, previous_secret FROM webhook_endpoints").fetchone()
        assert row == (rotated.secret, created.secret)


def test_a_login_role_joins_only_the_service_groups(pg_url):
    with pytest.raises(ValueError, match="quota_app or quota_relay"):
        ensure_login_role(pg_url, "ql_never", group="pg_read_server_files")


def test_a_service_login_once_shared_with_the_relay_loses_the_secrets(pg_url, db_url):
    """A deployment that ran web and relay as one login: making it the service's role again takes
    quota_relay back, and migrate refuses one name for both roles."""
    name = f"ql_shared_{uuid.uuid4().hex[:8]}"
    try:
        ensure_login_role(pg_url, name, "pw", group=RELAY_GROUP)
        ensure_login_role(pg_url, name, "pw")
        with psycopg.connect(as_login(db_url, name, "pw"), autocommit=True) as c, pytest.raises(CannotSign):
            check_can_sign(c)
        done = subprocess.run(
            [sys.executable, "-m", "service.cli", "migrate", "--login-role", name, "--relay-role", name],
            env={**os.environ, "DATABASE_URL": db_url},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2 and "--relay-role" in done.stderr, done.stderr
    finally:
        with psycopg.connect(pg_url, autocommit=True) as c:
            c.execute(f'DROP ROLE IF EXISTS "{name}"')
