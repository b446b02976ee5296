"""The period's ledger as a streamed CSV response: GET /v1/ledger.csv and the console's download.
Not a view module, so that both views take it from here (tests/unit/test_http_layout.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import ExitStack, closing
from itertools import chain

import psycopg
from flask import Response

from service.http.runtime import runtime
from service.quota import export, ledger

log = logging.getLogger(__name__)


def response(period: str) -> Response:
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
        # The query runs here, before the response starts: its errors are answered as JSON (as a
        # page, in the console).
        first = next(rows, None)
        body = export.csv_chunks(() if first is None else chain((first,), rows))
        resp = Response(
            body,
            mimetype="text/csv",
            headers={"Content-Disposition": f'attachment; filename="ledger-{period}.csv"'},
        )
        # The server closes the response when it is sent, or when sending it failed.
        resp.call_on_close(release(held.pop_all()))
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
