"""Take and release: the only ways a counter moves between resets, each with its ledger row."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import psycopg
from psycopg.rows import class_row, dict_row

from service.billing.plans import PlanConfig
from service.db import Connection, Q
from service.errors import (
    AccountDeleted,
    IdempotencyKeyReused,
    QuotaExhausted,
    UnknownAccount,
    UnknownMetric,
    UnknownTake,
)
from service.quota import periods
from service.quota.accounts import ensure_quotas

ROLLOVER_ACTOR = "system:rollover"
R = TypeVar("R")


@dataclass(frozen=True, kw_only=True)
class Take:
    """A granted take. `replayed` is true when an idempotency key returned an earlier take."""

    take_id: int
    metric: str
    units: int
    used: int
    limit: int | None
    period: str
    limit_source: str
    replayed: bool = False

    @property
    def remaining(self) -> int | None:
        return None if self.limit is None else max(self.limit - self.used, 0)


@dataclass(frozen=True, kw_only=True)
class Release:
    """The outcome of a release: `released` false carries the `reason`."""

    released: bool
    take_id: int
    reason: str | None = None
    account_id: str | None = None
    metric: str | None = None
    units: int = 0
    used: int | None = None
    limit: int | None = None
    period: str | None = None
    limit_source: str | None = None
    release_id: int | None = None

    @property
    def remaining(self) -> int | None:
        if self.limit is None or self.used is None:
            return None
        return max(self.limit - self.used, 0)


# A chain writer that lost the race for its counter on Citus runs again with a new ledger id
# (migrations/0012): it may lose again to as many writers as wait on the same counter.
REDRAWS = 100


def redrawn(statement: Callable[[], R]) -> R:
    """Run a ledger-writing statement (autocommit: it is its own transaction), again while Citus
    refuses the ledger id it drew as older than its counter's newest row (quotas_chain_in_id_order,
    migrations/0012). On plain PostgreSQL the id is drawn after the row lock and this never repeats."""
    for attempt in range(REDRAWS):
        try:
            return statement()
        except psycopg.errors.SerializationFailure:
            if attempt == REDRAWS - 1:
                raise
    raise AssertionError("unreachable")


def take(
    conn: Connection,
    plans: PlanConfig,
    *,
    account_id: str,
    metric: str,
    units: int = 1,
    idempotency_key: str | None = None,
    actor: str,
    period: str | None = None,
) -> Take:
    """Take `units` of `metric` for the current period, or raise QuotaExhausted, UnknownAccount,
    AccountDeleted or UnknownMetric. With an idempotency key already used by this account, returns
    the original take and moves nothing. Call on an autocommit connection: the take is one statement."""
    if metric not in plans.metrics:
        raise UnknownMetric(f"unknown metric {metric!r}; known: {', '.join(plans.metrics)}")
    period = period or periods.current_period()
    params = {
        "account_id": account_id,
        "metric": metric,
        "units": units,
        "period": period,
        "idempotency_key": idempotency_key,
        "actor": actor,
    }
    # Almost always one pass. The loop only turns when the refusal is something we can mend:
    # a new month (roll the counter over), a counter row not created yet, or a release that freed
    # room between our statement and the diagnosis.
    for _ in range(4):
        try:
            with conn.cursor(row_factory=class_row(Take)) as cur:
                granted = redrawn(lambda: cur.execute(Q.take, params).fetchone())
        except psycopg.errors.UniqueViolation:
            granted = None  # the key was taken by an earlier (or concurrent, now committed) take
        if granted is not None:
            return granted
        with conn.cursor(row_factory=dict_row) as cur:
            if idempotency_key is not None:
                earlier = cur.execute(Q.take_by_key, params).fetchone()
                if earlier is not None:
                    if earlier["metric"] != metric or earlier["units"] != units:
                        raise IdempotencyKeyReused(take_id=earlier["take_id"])
                    return Take(**earlier, replayed=True)
            why = cur.execute(Q.take_refusal, params).fetchone()
        if why is None:
            raise UnknownAccount(f"unknown account {account_id!r}")
        if why["deleted"]:
            raise AccountDeleted(f"account {account_id!r} was deleted")
        if why["period"] is None:
            ensure_quotas(conn, plans, account_id=account_id, period=period)
            continue
        if why["period"] < period:
            redrawn(lambda: conn.execute(Q.roll_over, {**params, "actor": ROLLOVER_ACTOR}))
            continue
        if why["period"] > period:  # another server's clock already opened the next month
            params["period"] = period = why["period"]
            continue
        limit = why["limit"]
        if limit is not None and why["used"] + units > limit:
            raise QuotaExhausted(
                f"{metric}: {units} more would exceed the limit of {limit}",
                used=why["used"],
                limit=limit,
                remaining=max(limit - why["used"], 0),
                period=period,
                limit_source=why["limit_source"],
            )
    # Only reachable if the counter keeps changing under us (releases racing the diagnosis): refuse
    # with the last state seen; the client may simply retry.
    assert why is not None  # every pass that gets here has read the counter
    used, limit = why["used"], why["limit"]
    raise QuotaExhausted(
        "the counter kept changing during the take; retry",
        used=used,
        limit=limit,
        remaining=None if limit is None else max(limit - used, 0),
        period=period,
        limit_source=why["limit_source"],
    )


def release(
    conn: Connection, *, take_id: int, actor: str, period: str | None = None, account_id: str | None = None
) -> Release:
    """Give back a take's units, once. A take from a closed period or already released moves
    nothing and says why; an unknown take (or one of another account than `account_id`) raises
    UnknownTake. Naming the account keeps a release on its shard under Citus; without it, the
    take's account is looked up first."""
    period = period or periods.current_period()
    if account_id is None:
        found = conn.execute(Q.take_account, {"take_id": take_id}).fetchone()
        if found is None:
            raise UnknownTake(f"unknown take {take_id}")
        account_id = str(found[0])
    params = {"take_id": take_id, "period": period, "actor": actor, "account_id": account_id}
    try:
        with conn.cursor(row_factory=class_row(Release)) as cur:
            done = redrawn(lambda: cur.execute(Q.release, params).fetchone())
    except psycopg.errors.UniqueViolation:
        done = None  # a concurrent release of the same take committed first
    if done is not None:
        return done
    with conn.cursor(row_factory=dict_row) as cur:
        why = cur.execute(Q.release_refusal, params).fetchone()
    if why is None:
        raise UnknownTake(f"unknown take {take_id}")
    if why["released"]:
        return Release(released=False, take_id=take_id, reason="already_released")
    return Release(released=False, take_id=take_id, reason="period_closed", period=why["period"])
