"""Credits: grants of units of a consumable metric on top of the plan's allowance (README "Credits").

A take draws on the allowance first, then on the account's live grants, soonest expiry first (none
last), then oldest (migrations/repeatable/grants.sql `ledger_take_credits`, called by takes.py only
after the take's own statement refused). Every unit that enters, leaves or comes back to a grant is
a ledger row in its counter's hash chain. A grant is created once per (source, reference), voided
forward-only, and ends at its expiry whether or not the expiry job has written its row: takes and
reads ignore a grant past its time. Resets never touch grants.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from psycopg.rows import class_row, dict_row

from service.db import Connection, Q
from service.errors import AccountDeleted, IdempotencyKeyReused, NotGrantable, UnknownGrant
from service.plans import PlanConfig
from service.quota.accounts import ensure_quotas, find_account, require_metric
from service.vocabulary import GrantSource, MetricKind

EXPIRY_ACTOR = "system:grant-expiry"
# The times an expiry is kept within: any later is never in practice, any earlier ended already, and
# both read back as Python datetimes (years 1-9999 in UTC, whatever offset the client wrote).
EARLIEST = datetime(1, 1, 2, tzinfo=UTC)
LATEST = datetime(9999, 12, 30, tzinfo=UTC)
EXPIRE_BATCH = 500  # grants per run of the expiry job's read


@dataclass(frozen=True, kw_only=True)
class Grant:
    """A grant as the API shows it: `remaining` is what is left now (0 once it ended); `status` is
    live, used (nothing left), expired or voided."""

    grant_id: int
    account_id: str
    metric: str
    units: int
    remaining: int
    expires_at: datetime | None
    source: str
    source_ref: str
    note: str | None
    created_at: datetime
    voided_at: datetime | None
    status: str
    created: bool = False  # true when this call created it (false: the key found an earlier one)


@dataclass(frozen=True, kw_only=True)
class Voided:
    """A void's answer: units forfeited by the void (all voids of the grant), units drawn and not given
    back; `changed` false when nothing was written (voided before)."""

    grant_id: int
    voided: int
    used: int
    changed: bool


def require_grantable(plans: PlanConfig, metric: str) -> None:
    """UnknownMetric, or NotGrantable for an allocation: credits are for consumables only."""
    require_metric(plans, metric)
    if plans.metric(metric).kind != MetricKind.CONSUMABLE:
        raise NotGrantable(f"{metric} is an allocation; grants add units of consumable metrics only")


def create_grant(
    conn: Connection,
    plans: PlanConfig,
    *,
    account_id: str,
    metric: str,
    units: int,
    source: GrantSource,
    source_ref: str,
    actor: str,
    expires_at: datetime | None = None,
    note: str | None = None,
) -> Grant:
    """Grant `units` of `metric` to the account, once per (source, source_ref): the same reference
    again returns the first grant (`created` false) and writes nothing, or IdempotencyKeyReused when
    it named another metric or number of units. UnknownAccount, AccountDeleted, UnknownMetric,
    NotGrantable. Call on an autocommit connection (or inside a transaction of the caller's)."""
    require_grantable(plans, metric)
    if units <= 0:
        raise ValueError("a grant has at least one unit")
    account = find_account(conn, account_id=account_id)
    if account.deleted:
        raise AccountDeleted(f"account {account_id!r} was deleted")
    ensure_quotas(conn, plans, account_id=account_id)
    if expires_at is not None:
        expires_at = min(max(expires_at, EARLIEST), LATEST)
    params = {
        "account_id": account_id,
        "metric": metric,
        "units": units,
        "expires_at": expires_at,
        "source": str(source),
        "source_ref": source_ref,
        "note": note,
        "actor": actor,
    }
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q.grant_create, params).fetchone()
    assert row is not None, "ensure_quotas made the counter"
    grant = grant_of(conn, account_id=account_id, grant_id=row["grant_id"])
    if not row["created"] and (grant.metric, grant.units) != (metric, units):
        raise IdempotencyKeyReused(
            f"key {source_ref!r} already granted {grant.units} {grant.metric} (grant {grant.grant_id})",
            grant_id=grant.grant_id,
        )
    return Grant(**{**vars(grant), "created": bool(row["created"])})


def admin_grant(
    conn: Connection,
    plans: PlanConfig,
    *,
    account_id: str,
    metric: str,
    units: int,
    idempotency_key: str,
    actor: str,
    expires_at: datetime | None = None,
    note: str | None = None,
) -> Grant:
    """An admin's grant (the API's GrantRequest, from POST /v1/admin/accounts/{id}/grants or the
    console's form): `create_grant` of source admin, keyed by the admin's idempotency key."""
    return create_grant(
        conn,
        plans,
        account_id=account_id,
        metric=metric,
        units=units,
        source=GrantSource.ADMIN,
        source_ref=idempotency_key,
        actor=actor,
        expires_at=expires_at,
        note=note,
    )


def grant_of(conn: Connection, *, account_id: str, grant_id: int) -> Grant:
    """One grant of the account, or UnknownGrant."""
    found = list_grants(conn, account_id=account_id, grant_id=grant_id)
    if not found:
        raise UnknownGrant(f"unknown grant {grant_id}")
    return found[0]


def list_grants(
    conn: Connection, *, account_id: str, metric: str | None = None, grant_id: int | None = None
) -> list[Grant]:
    """The account's grants (of `metric`), live and ended, newest first."""
    params = {"account_id": account_id, "metric": metric, "grant_id": grant_id}
    with conn.cursor(row_factory=class_row(Grant)) as cur:
        return cur.execute(Q.grants_of_account, params).fetchall()


def credits(conn: Connection, *, account_id: str) -> dict[str, int]:
    """Each metric's credits: the units the account's live grants have left (a metric with none is
    absent)."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(Q.grant_credits, {"account_id": account_id}).fetchall()
    return {r["metric"]: int(r["credits"]) for r in rows}


def grant_account(conn: Connection, *, grant_id: int) -> str:
    """The account of a grant named by its id alone, or UnknownGrant."""
    row = conn.execute(Q.grant_account, {"grant_id": grant_id}).fetchone()
    if row is None:
        raise UnknownGrant(f"unknown grant {grant_id}")
    return str(row[0])


def void_grant(
    conn: Connection, *, grant_id: int, actor: str, account_id: str | None = None, units: int | None = None
) -> Voided:
    """Void the grant forward-only: what is left of it is forfeited (a `grant_void` ledger row and
    an audit row), what takes drew stays drawn, a later release of such a draw is forfeited too.
    `units`: at most that many (a partial refund), else the whole remainder. Voiding a voided grant
    again writes nothing and answers as before. UnknownGrant."""
    account_id = account_id or grant_account(conn, grant_id=grant_id)
    params = {"account_id": account_id, "grant_id": grant_id, "units": units, "actor": actor}
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q.grant_void, params).fetchone()
    if row is None:
        raise UnknownGrant(f"unknown grant {grant_id}")
    return Voided(grant_id=grant_id, voided=row["voided"], used=row["used"], changed=row["changed"])


def expire_due(conn: Connection, *, limit: int = EXPIRE_BATCH, actor: str = EXPIRY_ACTOR) -> int:
    """Write the expiry row of every grant past its time that has none yet, each in its own
    account's call (one shard at a time on Citus); returns how many were written. Safe to run twice
    or on two workers at once: a grant expired already is skipped under its lock. Not needed for
    correctness (takes and reads ignore a grant past its time): the rows are the ledger's account of
    what expired. Call on an autocommit connection."""
    done = 0
    while True:
        with conn.cursor(row_factory=dict_row) as cur:
            due = cur.execute(Q.grants_due, {"limit": limit}).fetchall()
        wrote = 0
        for g in due:
            row = conn.execute(Q.grant_expire, {**g, "actor": actor}).fetchone()
            wrote += bool(row and row[0])
        done += wrote
        if len(due) < limit or wrote == 0:
            return done
