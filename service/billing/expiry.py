"""Access that ends by time: subscriptions whose end (`expires_at`: a RevenueCat purchase's
expiration, a grace period's end, a temporary grant's 24 hours) has passed without an event saying
so are ended here, and their accounts follow their deciding subscription (billing_set_tier: tier,
status and limits, audited).

Run by the hourly worker task and `quota-ledger expire-access`; safe to run twice and concurrently
with deliveries: each account is handled in its own short transaction under its row lock (the lock
and billing_version bump of the locked delivery path), so a delivery for the same account
(billing_deliver, which locks it first) waits for it, and the statement that ends a subscription
re-checks that it is still due.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from psycopg.rows import dict_row

from service.billing.apply import lock_accounts, set_tier
from service.db import Connection, Q, transaction
from service.plans import PlanConfig

ACTOR = "system:expire_access"
DEFAULT_BATCH_SIZE = 500


@dataclass(frozen=True, kw_only=True)
class ExpiryOutcome:
    accounts: int
    subscriptions: int

    @property
    def message(self) -> str:
        return f"expire access: ended {self.subscriptions} subscriptions of {self.accounts} accounts"


def end_expired(
    conn: Connection, plans: PlanConfig, *, at: datetime | None = None, batch_size: int = DEFAULT_BATCH_SIZE
) -> ExpiryOutcome:
    """End every subscription whose access ended by `at` (default now). Needs an autocommit
    connection."""
    at = at or datetime.now(UTC)
    accounts = subscriptions = 0
    while True:
        with conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(Q.subscriptions_due_accounts, {"at": at, "batch_size": batch_size})
            due = [str(r["account_id"]) for r in rows]
        if not due:
            break
        ended_now = 0
        for account_id in due:
            with transaction(conn):
                locked = lock_accounts(conn, [account_id])
                ended = conn.execute(
                    Q.subscriptions_end_by_time, {"account_id": account_id, "at": at}
                ).fetchall()
                if ended:
                    set_tier(conn, plans, locked, actor=ACTOR)
            ended_now += len(ended)
            accounts += bool(ended)
        subscriptions += ended_now
        if ended_now == 0:  # every due row was ended meanwhile by someone else
            break
    return ExpiryOutcome(accounts=accounts, subscriptions=subscriptions)
