"""Finance API: ledger pages, the CSV export of a period, reconciliation, the audit log."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import ExitStack, closing
from itertools import chain

import psycopg
from flask import Blueprint, Response, jsonify, request

from service.http.auth import require
from service.http.errors import ValidationFailed, refuses
from service.http.runtime import ExportsBusy, runtime
from service.http.schemas import requests as rq
from service.http.schemas import responses as rs
from service.http.validation import query_args
from service.quota import export, ledger

log = logging.getLogger(__name__)
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
    return csv_export(query_args(rq.PERIOD_QUERY)["period"])


def csv_export(period: str) -> Response:
    """The period's CSV as a streamed response (the console's download too)."""
    rt = runtime()
    with ExitStack() as held:
        conn = held.enter_context(rt.export_connection())
        rows = held.enter_context(
            closing(
                ledger.period_rows(
                    conn,
                    period=period,
                    batch=export.ROWS_PER_CHUNK,  # one fetch per chunk sent: idle at most one send
                    idle_timeout=rt.settings.export_idle_timeout,
                )
            )
        )
        # The query runs here, before the response starts: its errors are answered as JSON.
        first = next(rows, None)
        body = export.csv_chunks(() if first is None else chain((first,), rows))
        resp = Response(
            body,
            mimetype="text/csv",
            headers={"Content-Disposition": f'attachment; filename="ledger-{period}.csv"'},
        )
        # The server closes the response when it is sent, or when sending it failed.
        resp.call_on_close(release(held.pop_all()))
    stall_limit(rt.settings.export_idle_timeout)
    return resp


def release(held: ExitStack) -> Callable[[], None]:
    """Give the export's cursor, transaction and connection back. Their closing fails when PostgreSQL
    ended a stalled export (EXPORT_IDLE_TIMEOUT); the response is over either way."""

    def close() -> None:
        try:
            held.close()
        except psycopg.Error as e:
            log.warning("export ended: %s", e)

    return close


def stall_limit(seconds: float) -> None:
    """A reader that takes nothing for `seconds` fails the response's next send: the server then closes
    the connection (and so the export). gunicorn gives the app its socket; its gthread worker puts the
    socket back to blocking for the connection's next request."""
    sock = request.environ.get("gunicorn.socket")
    if sock is not None:
        sock.settimeout(seconds)


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
