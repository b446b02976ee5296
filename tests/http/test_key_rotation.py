"""`quota-ledger keys rotate`: the new key works at once, the old one until its grace ends and not a
moment longer (a process's key cache included), a second rotation works, every rotation is audited,
and an unknown or revoked name or a bad duration is refused in one line (exit 2)."""

from __future__ import annotations

import dataclasses
import time
from datetime import timedelta
from typing import Any

import pytest

from service.cli import _duration
from service.http import auth
from service.keys import create_key, hash_key, revoke_key, rotate_key
from tests.conftest import running_app
from tests.db.test_cli_usage import one_line, run
from tests.http.conftest import assert_error

ANY_ROUTE = "/v1/accounts/nobody"  # 404 for any product key that authenticates, 401 for any other


def accepted(client: Any, key: str) -> bool:
    r = client.get(ANY_ROUTE, headers={"Authorization": f"Bearer {key}"})
    if r.status_code == 401:
        assert_error(r, 401, "unauthorized")
        return False
    assert r.status_code == 404, r.get_data(as_text=True)
    return True


def keys_cli(db_url: str, *args: str) -> Any:
    return run("keys", *args, env={"DATABASE_URL": db_url})


def rotated(db_url: str, name: str, *grace: str) -> tuple[str, str]:
    """`keys rotate NAME [--grace G]`: (its first line, the new key: the last line alone)."""
    done = keys_cli(db_url, "rotate", name, *grace)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 2 and lines[1].startswith("qlk_"), done.stdout
    return lines[0], lines[1]


def end_grace(conn: Any, name: str) -> None:
    """As the owner: every rotated key of `name` reached its end a second ago."""
    conn.execute(
        "UPDATE api_keys SET expires_at = now() - interval '1 second'"
        " WHERE name = %s AND expires_at IS NOT NULL",
        (name,),
    )


def test_rotate_keeps_the_old_key_for_its_grace_then_refuses_it(client: Any, conn: Any, db_url: str) -> None:
    old = create_key(conn, name="svc", role="product")
    said, new = rotated(db_url, "svc")
    assert said.startswith("rotated product key 'svc'; the old key stays valid until ")
    assert said.endswith(" UTC (24h); the new key is shown only once:")
    assert accepted(client, new) and accepted(client, old)  # both during the grace
    end = conn.execute("SELECT expires_at - now() FROM api_keys WHERE key_hash = %s", (hash_key(old),))
    assert timedelta(hours=23, minutes=59) < end.fetchone()[0] <= timedelta(hours=24)  # the default grace
    listed = keys_cli(db_url, "list").stdout.splitlines()
    assert [line.split("\t")[:2] for line in listed] == [["svc", "product"], ["svc", "product"]]
    assert "\texpires " in listed[0] and "expire" not in listed[1], listed

    end_grace(conn, "svc")
    assert not accepted(client, old)
    assert accepted(client, new)
    assert "\texpired " in keys_cli(db_url, "list").stdout.splitlines()[0]


def test_grace_0_ends_the_old_key_at_once(client: Any, conn: Any, db_url: str) -> None:
    old = create_key(conn, name="svc", role="admin")
    said, new = rotated(db_url, "svc", "--grace", "0")
    assert said.startswith("rotated admin key 'svc'; the old key is no longer valid")
    assert not accepted(client, old)
    admin = client.get("/v1/admin/accounts/nobody", headers={"Authorization": f"Bearer {new}"})
    assert admin.status_code == 404


def test_rotating_twice(client: Any, conn: Any, db_url: str) -> None:
    first = create_key(conn, name="svc", role="product")
    _, second = rotated(db_url, "svc", "--grace", "7d")
    _, third = rotated(db_url, "svc", "--grace", "30m")
    assert accepted(client, first) and accepted(client, second) and accepted(client, third)
    ends = dict(
        conn.execute(
            "SELECT key_hash, expires_at - now() FROM api_keys WHERE name = 'svc' AND expires_at IS NOT NULL"
        ).fetchall()
    )
    # the first key's end follows the later, shorter grace: after a rotation only its new key is
    # valid once that grace ends
    assert ends[hash_key(first)] == ends[hash_key(second)]
    assert timedelta(minutes=29) < ends[hash_key(second)] <= timedelta(minutes=30)
    _, fourth = rotated(db_url, "svc", "--grace", "0")
    assert [accepted(client, k) for k in (first, second, third, fourth)] == [False, False, False, True]
    assert conn.execute("SELECT count(*) FROM api_keys WHERE name = 'svc'").fetchone()[0] == 4


def test_a_rotation_is_audited(conn: Any, db_url: str) -> None:
    create_key(conn, name="svc", role="finance")
    rotated(db_url, "svc", "--grace", "1h")
    [(actor, account, old, new)] = conn.execute(
        "SELECT actor, account_id, old, new FROM audit_log WHERE action = 'key_rotated'"
    ).fetchall()
    assert actor.startswith("cli:") and account == ""
    assert old == {"name": "svc", "role": "finance", "old_key_until": None}
    until = conn.execute("SELECT expires_at FROM api_keys WHERE name = 'svc' AND expires_at IS NOT NULL")
    assert new == {"name": "svc", "role": "finance", "old_key_until": until.fetchone()[0].isoformat()}


def test_revoke_ends_the_key_in_its_grace_too(client: Any, conn: Any) -> None:
    old = create_key(conn, name="svc", role="product")
    rotation = rotate_key(conn, name="svc", grace=timedelta(hours=1))
    assert rotation is not None and accepted(client, old)
    assert revoke_key(conn, name="svc")
    assert not accepted(client, old) and not accepted(client, rotation.key)


def test_an_unknown_or_revoked_name_or_a_bad_duration_exits_2(conn: Any, db_url: str) -> None:
    assert one_line(keys_cli(db_url, "rotate", "nobody")) == (
        "quota-ledger keys rotate: no live key named 'nobody' (keys list shows them)"
    )
    create_key(conn, name="gone", role="product")
    assert revoke_key(conn, name="gone")
    assert "no live key named 'gone'" in one_line(keys_cli(db_url, "rotate", "gone"))
    create_key(conn, name="svc", role="product")
    for bad in ("5x", "-1h", "1.5h", "h", "24", "", "1 h", "٣h"):
        line = one_line(keys_cli(db_url, "rotate", "svc", f"--grace={bad}"))
        assert line.startswith("quota-ledger keys rotate: ") and "is not a duration" in line, line
    assert conn.execute("SELECT count(*) FROM api_keys WHERE name = 'svc'").fetchone()[0] == 1
    assert not conn.execute("SELECT 1 FROM audit_log WHERE action = 'key_rotated'").fetchall()


def test_rotate_as_the_service_s_role_says_to_run_it_as_the_owner(conn: Any, app_db_url: str) -> None:
    create_key(conn, name="svc", role="product")
    assert "as the tables' owner" in one_line(keys_cli(app_db_url, "rotate", "svc"))


@pytest.mark.parametrize(
    ("text", "grace"),
    [
        ("0", timedelta(0)),
        ("45s", timedelta(seconds=45)),
        ("30m", timedelta(minutes=30)),
        ("24h", timedelta(hours=24)),
        ("7d", timedelta(days=7)),
    ],
)
def test_durations(text: str, grace: timedelta) -> None:
    assert _duration(text) == grace


def test_a_cached_key_stops_when_its_grace_ends(conn: Any, settings: Any) -> None:
    caching = dataclasses.replace(settings, key_cache_seconds=300.0)
    with running_app(caching) as app:
        client = app.test_client()
        # the cache is on: a revoked key it holds is still accepted (for up to KEY_CACHE_SECONDS)
        plain = create_key(conn, name="plain", role="product")
        assert accepted(client, plain)
        assert revoke_key(conn, name="plain")
        assert accepted(client, plain)

        old = create_key(conn, name="svc", role="product")
        rotation = rotate_key(conn, name="svc", grace=timedelta(seconds=1))
        assert rotation is not None
        assert accepted(client, old)  # in its grace: verified, and cached
        assert hash_key(old) in auth._cache
        left = rotation.old_until - conn.execute("SELECT now()").fetchone()[0]
        time.sleep(max(0.0, left.total_seconds()) + 0.1)
        assert hash_key(old) in auth._cache  # the entry is still there, and no longer trusted
        assert not accepted(client, old)
        assert accepted(client, rotation.key)


def test_help_describes_rotate() -> None:
    helped = run("keys", "rotate", "--help")
    assert helped.returncode == 0, helped.stderr
    text = " ".join(helped.stdout.split())
    assert "keep the old one valid for the grace" in text and "(default: 24h)" in text, text
    assert "rotate" in run("keys", "--help").stdout
