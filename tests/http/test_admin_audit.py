"""Restore of a soft-deleted account, and `/v1/audit` as the one list of what admins did: override
set and clear, reset, delete, restore, replay (tests/webhooks/test_replay.py), key create and revoke."""

from __future__ import annotations

from typing import Any

from service.keys import create_key, revoke_key
from tests.http.conftest import assert_error, take


def _audit(client: Any, keys: Any, account: str | None = None) -> list[dict[str, Any]]:
    query = {"limit": 1000, **({"account_id": account} if account else {})}
    r = client.get("/v1/audit", query_string=query, headers=keys["finance"])
    assert r.status_code == 200, r.json
    return r.json["items"]


def test_restore_brings_takes_back_and_is_audited(client: Any, keys: Any, account: str) -> None:
    take(client, keys, account, metric="urls")
    assert client.delete(f"/v1/admin/accounts/{account}", headers=keys["admin"]).status_code == 200
    assert take(client, keys, account, status=410, metric="urls")["error"] == "account_deleted"

    r = client.post(f"/v1/admin/accounts/{account}/restore", headers=keys["admin"])

    assert r.status_code == 200, r.json
    assert r.json == {"id": account, "deleted": False, "restored": True}
    assert take(client, keys, account, metric="urls")["used"] == 2
    assert client.get(f"/v1/admin/accounts/{account}", headers=keys["admin"]).json["deleted"] is False
    actions = [(a["action"], a["actor"], a["old"], a["new"]) for a in _audit(client, keys, account)]
    assert actions[-2:] == [
        ("account_deleted", "test-admin", {"deleted": False}, {"deleted": True}),
        ("account_restored", "test-admin", {"deleted": True}, {"deleted": False}),
    ]


def test_restore_of_a_live_account_changes_nothing_and_claims_nothing(
    client: Any, keys: Any, account: str
) -> None:
    before = _audit(client, keys, account)
    r = client.post(f"/v1/admin/accounts/{account}/restore", headers=keys["admin"])
    assert r.status_code == 200 and r.json == {"id": account, "deleted": False, "restored": False}
    assert _audit(client, keys, account) == before


def test_restore_refusals(client: Any, keys: Any, account: str) -> None:
    assert_error(
        client.post("/v1/admin/accounts/nobody/restore", headers=keys["admin"]), 404, "unknown_account"
    )
    assert_error(client.post(f"/v1/admin/accounts/{account}/restore", headers=keys["product"]), 403)
    assert_error(client.post(f"/v1/admin/accounts/{account}/restore"), 401)
    assert_error(client.post("/v1/admin/accounts/bad id/restore", headers=keys["admin"]), 422)


def test_an_admin_reset_is_audited_with_the_value_it_cleared(client: Any, keys: Any, account: str) -> None:
    take(client, keys, account, metric="urls", units=3)
    r = client.post(f"/v1/admin/accounts/{account}/reset", json={"metric": "urls"}, headers=keys["admin"])
    assert r.status_code == 200 and r.json["previous"] == 3
    [row] = [a for a in _audit(client, keys, account) if a["action"] == "counter_reset"]
    ledger_id = client.get(
        "/v1/ledger", query_string={"account_id": account, "kind": "reset"}, headers=keys["finance"]
    ).json["items"][0]["id"]
    assert (row["actor"], row["metric"]) == ("test-admin", "urls")
    assert row["old"] == {"used": 3, "period": r.json["period"]}
    assert row["new"] == {"used": 0, "period": r.json["period"], "ledger_id": ledger_id}


def test_key_create_and_revoke_are_audited(client: Any, keys: Any, conn: Any) -> None:
    create_key(conn, name="ops-2", role="admin", actor="cli:alice")
    assert revoke_key(conn, name="ops-2", actor="cli:bob")
    assert not revoke_key(conn, name="ops-2", actor="cli:bob")  # nothing revoked, nothing audited
    rows = [(a["action"], a["actor"], a["account_id"], a["old"], a["new"]) for a in _audit(client, keys)]
    assert ("key_created", "cli:alice", None, None, {"name": "ops-2", "role": "admin"}) in rows
    revoked = [r for r in rows if r[0] == "key_revoked"]
    assert revoked == [
        (
            "key_revoked",
            "cli:bob",
            None,
            {"name": "ops-2", "role": "admin", "revoked": False},
            {"name": "ops-2", "role": "admin", "revoked": True},
        )
    ]
