"""The audit log: what admins did (overrides, resets, deletes, restores, replays), API keys created
and revoked, and plan-limit changes. Append-only, like the ledger; finance reads it at /v1/audit.

The service's role appends no row itself: each audited change is a database function that writes
its audit row in the same call (docs/design/ledger-writers.md). `record` is the owner's, for what
runs as the owner (`quota-ledger keys`)."""

from __future__ import annotations

from psycopg.types.json import Jsonb

from service.db import Connection, Q


def record(
    conn: Connection,
    *,
    actor: str,
    action: str,
    account_id: str = "",
    metric: str | None = None,
    old: object,
    new: object,
) -> None:
    """One audit row, in the caller's transaction, so that it commits with the change it records.
    `account_id` is "" for actions on no account (API keys). Needs a connection as the owner."""
    conn.execute(
        Q.audit,
        {
            "actor": actor,
            "action": action,
            "account_id": account_id,
            "metric": metric,
            "old": Jsonb(old),
            "new": Jsonb(new),
        },
    )
