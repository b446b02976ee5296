"""Finance API: ledger pages, the CSV export of a period, reconciliation, the audit log."""

from __future__ import annotations

from collections.abc import Iterator

from flask import Blueprint, Response, jsonify

from service.http import schemas as s
from service.http.auth import require
from service.http.runtime import runtime
from service.http.validation import query_args
from service.quota import export, ledger

bp = Blueprint("finance", __name__, url_prefix="/v1")


@bp.get("/ledger")
@require("finance")
def get_ledger() -> Response:
    """Ledger rows in id order (write order on one PostgreSQL; on Citus ids are only unique), filtered
    by account, metric, period and kind; paged.
    ---
    get:
      parameters: [{in: query, schema: LedgerQuery}]
      responses:
        200: {description: a page, content: {application/json: {schema: LedgerPage}}}
        422: InvalidRequest
    """
    args = query_args(s.LEDGER_QUERY)
    after = int(args.pop("cursor", 0))
    with runtime().connection() as conn:
        rows = ledger.page(conn, after=after, **args)
    # export.record is the row format of every export (CSV, JSONL, this page); the schema shapes it
    return jsonify(s.LEDGER_PAGE.dump(s.page([export.record(r) for r in rows], args["limit"])))


@bp.get("/ledger.csv")
@require("finance")
def get_ledger_csv() -> Response:
    """The period's ledger as a streamed CSV, safe to open in a spreadsheet.
    ---
    get:
      parameters: [{in: query, schema: PeriodQuery}]
      responses:
        200:
          description: a header row, then one row per ledger row (README, the CSV export)
          content: {text/csv: {schema: {type: string}}}
        422: InvalidRequest
    """
    period = query_args(s.PERIOD_QUERY)["period"]
    rt = runtime()

    def rows() -> Iterator[str]:
        with rt.connection() as conn:
            yield from export.csv_chunks(ledger.period_rows(conn, period=period))

    return Response(
        rows(),
        mimetype="text/csv",
        headers={"Content-Disposition": f'attachment; filename="ledger-{period}.csv"'},
    )


@bp.get("/reconciliation")
@require("finance")
def get_reconciliation() -> Response:
    """Counters checked against the ledger for a period.
    ---
    get:
      parameters: [{in: query, schema: PeriodQuery}]
      responses:
        200: {description: the check, content: {application/json: {schema: ReconciliationResponse}}}
        422: InvalidRequest
    """
    period = query_args(s.PERIOD_QUERY)["period"]
    with runtime().connection() as conn:
        result = ledger.reconcile(conn, period=period)
    return jsonify(s.RECONCILIATION.dump(result))


@bp.get("/audit")
@require("finance", "admin")
def get_audit() -> Response:
    """Audit rows: what admins did, and plan-limit changes; paged.
    ---
    get:
      parameters: [{in: query, schema: AuditQuery}]
      responses:
        200: {description: a page, content: {application/json: {schema: AuditPage}}}
        422: InvalidRequest
    """
    args = query_args(s.AUDIT_QUERY)
    after = int(args.pop("cursor", 0))
    with runtime().connection() as conn:
        rows = ledger.audit_page(conn, after=after, **args)
    return jsonify(s.AUDIT_PAGE.dump(s.page(rows, args["limit"])))
