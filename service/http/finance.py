"""Finance API: ledger pages, the CSV export of a period, reconciliation, the audit log."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

from flask import Blueprint, Response, jsonify

from service.http import openapi, schemas
from service.http.auth import require
from service.http.runtime import runtime
from service.http.validation import query_args
from service.quota import ledger

bp = Blueprint("finance", __name__, url_prefix="/v1")


def _page(items: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """`next_cursor` is the last id of a full page; a short page is the end (null)."""
    return {"items": items, "next_cursor": str(items[-1]["id"]) if len(items) == limit else None}


def _entry_json(e: ledger.LedgerEntry) -> dict[str, Any]:
    out = asdict(e)
    out["at"] = e.at.isoformat()
    return out


@bp.get("/ledger")
@require("finance")
def get_ledger() -> Response:
    args = query_args(schemas.LedgerQuery())
    after = int(args.pop("cursor", 0))
    with runtime().connection() as conn:
        rows = ledger.page(conn, after=after, **args)
    return jsonify(_page([_entry_json(r) for r in rows], args["limit"]))


@bp.get("/ledger.csv")
@require("finance")
def get_ledger_csv() -> Response:
    period = query_args(schemas.PeriodQuery())["period"]
    rt = runtime()

    def rows() -> Iterator[str]:
        with rt.connection() as conn:
            yield from ledger.csv_chunks(ledger.period_rows(conn, period=period))

    return Response(
        rows(),
        mimetype="text/csv",
        headers={"Content-Disposition": f'attachment; filename="ledger-{period}.csv"'},
    )


@bp.get("/reconciliation")
@require("finance")
def get_reconciliation() -> Response:
    period = query_args(schemas.PeriodQuery())["period"]
    with runtime().connection() as conn:
        result = ledger.reconcile(conn, period=period)
    return jsonify(asdict(result))


@bp.get("/audit")
@require("finance", "admin")
def get_audit() -> Response:
    args = query_args(schemas.AuditQuery())
    after = int(args.pop("cursor", 0))
    with runtime().connection() as conn:
        rows = ledger.audit_page(conn, after=after, **args)
    for r in rows:
        r["at"] = r["at"].isoformat()
    return jsonify(_page(rows, args["limit"]))


E = schemas.Error
ERR = {400: E, 401: E, 403: E, 422: E}
openapi.register(
    "get",
    "/v1/ledger",
    "Ledger rows, newest last, with next_cursor",
    "finance",
    None,
    {200: schemas.LedgerPage, **ERR},
)
openapi.register("get", "/v1/ledger.csv", "The period's ledger as streamed CSV", "finance", None, ERR)
openapi.register(
    "get",
    "/v1/reconciliation",
    "Counters checked against the ledger for a period",
    "finance",
    None,
    {200: schemas.ReconciliationResponse, **ERR},
)
openapi.register(
    "get",
    "/v1/audit",
    "Audit rows (admin actions, plan-limit changes)",
    "finance or admin",
    None,
    {200: schemas.AuditPage, **ERR},
)
