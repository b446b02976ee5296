"""Finance API: ledger pages, the CSV export of a period, reconciliation, the audit log."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from service.http import ledger_csv
from service.http.auth import require
from service.http.errors import ValidationFailed, refuses
from service.http.runtime import ExportsBusy, runtime
from service.http.schemas import requests as rq
from service.http.schemas import responses as rs
from service.http.validation import query_args
from service.quota import export, ledger

bp = Blueprint("finance", __name__, url_prefix="/v1")


@bp.get("/ledger")
@require("finance")
@refuses(ValidationFailed)
def get_ledger() -> Response:
    """Ledger rows in id order (write order on one PostgreSQL; on Citus ids are only unique), filtered
    by account, metric, period and kind; paged.
    ---
    get:
      parameters: [{in: query, schema: LedgerQuery}]
      responses:
        200: {description: a page, content: {application/json: {schema: LedgerPage}}}
    """
    args = query_args(rq.LEDGER_QUERY)
    after = int(args.pop("cursor", 0))
    with runtime().connection() as conn:
        rows = ledger.page(conn, after=after, **args)
    # export.record is the row format of every export (CSV, JSONL, this page); the schema shapes it
    return jsonify(rs.LEDGER_PAGE.dump(rs.page([export.record(r) for r in rows], args["limit"])))


@bp.get("/ledger.csv")
@require("finance")
@refuses(ValidationFailed, ExportsBusy)
def get_ledger_csv() -> Response:
    """The period's ledger as a streamed CSV, safe to open in a spreadsheet.
    ---
    get:
      parameters: [{in: query, schema: PeriodQuery}]
      responses:
        200:
          description: a header row, then one row per ledger row (README, the CSV export)
          content: {text/csv: {schema: {type: string}}}
    """
    return ledger_csv.response(query_args(rq.PERIOD_QUERY)["period"])


@bp.get("/reconciliation")
@require("finance")
@refuses(ValidationFailed)
def get_reconciliation() -> Response:
    """Counters checked against the ledger for a period.
    ---
    get:
      parameters: [{in: query, schema: PeriodQuery}]
      responses:
        200: {description: the check, content: {application/json: {schema: ReconciliationResponse}}}
    """
    period = query_args(rq.PERIOD_QUERY)["period"]
    with runtime().connection() as conn:
        result = ledger.reconcile(conn, period=period)
    return jsonify(rs.RECONCILIATION.dump(result))


@bp.get("/audit")
@require("finance", "admin")
@refuses(ValidationFailed)
def get_audit() -> Response:
    """Audit rows: what admins did, and plan-limit changes; paged.
    ---
    get:
      parameters: [{in: query, schema: AuditQuery}]
      responses:
        200: {description: a page, content: {application/json: {schema: AuditPage}}}
    """
    args = query_args(rq.AUDIT_QUERY)
    after = int(args.pop("cursor", 0))
    with runtime().connection() as conn:
        rows = ledger.audit_page(conn, after=after, **args)
    return jsonify(rs.AUDIT_PAGE.dump(rs.page(rows, args["limit"])))
