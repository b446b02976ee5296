"""Take and release: the only ways a counter moves between resets, each with its ledger row."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, replace

import psycopg
from psycopg.rows import class_row, dict_row

from service.db import Connection, Q
from service.errors import (
    AccountDeleted,
    IdempotencyKeyReused,
    MetricKindChanged,
    QuotaExhausted,
    UnknownAccount,
    UnknownTake,
)
from service.plans import PlanConfig
from service.quota import periods
from service.quota.accounts import ensure_quotas, require_metric

ROLLOVER_ACTOR = "system:rollover"


@dataclass(frozen=True, kw_only=True)
class Take:
    """A granted take. `replayed` is true when an idempotency key returned an earlier take."""

    take_id: int
    metric: str
    units: int
    used: int
    limit: int | None
    counter_period: str  # periods.HELD for an allocation's take
    limit_source: str
    replayed: bool = False

    @property
    def remaining(self) -> int | None:
        return None if self.limit is None else max(self.limit - self.used, 0)

    @property
    def period(self) -> str | None:
        """The period the take counts in; None for an allocation's."""
        return periods.shown(self.counter_period)


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
    counter_period: str | None = None
    limit_source: str | None = None
    release_id: int | None = None

    @property
    def remaining(self) -> int | None:
        if self.limit is None or self.used is None:
            return None
        return max(self.limit - self.used, 0)

    @property
    def period(self) -> str | None:
        return None if self.counter_period is None else periods.shown(self.counter_period)


@dataclass(frozen=True, kw_only=True)
class _Attempt:
    """One take as the statements see it: vars() of it are their named parameters."""

    account_id: str
    metric: str
    units: int
    period: str
    idempotency_key: str | None
    actor: str


@dataclass(frozen=True, kw_only=True)
class _Counter:
    """The counter a refused take met (period, used, limit: None when the account has none yet)."""

    deleted: bool
    period: str | None
    used: int | None
    limit: int | None
    limit_source: str | None


# A take that meets a counter to mend (not created yet, last month's, next month's) or a release
# that freed room since the statement goes round again; more passes than that means the counter
# keeps changing under it.
MAX_PASSES = 4


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
    the original take and moves nothing. Call on an autocommit connection: the take is one statement,
    and everything after it runs only when it was refused."""
    require_metric(plans, metric)
    attempt = _Attempt(
        account_id=account_id,
        metric=metric,
        units=units,
        period=period or plans.period(metric),
        idempotency_key=idempotency_key,
        actor=actor,
    )
    for _ in range(MAX_PASSES):
        granted = _take(conn, attempt)
        if granted is not None:
            return granted
        earlier = _replay(conn, attempt)
        if earlier is not None:
            return earlier
        counter = _refusal(conn, attempt)
        if counter.period is None:
            _create_counter(conn, plans, attempt)
        elif not periods.same_kind(counter.period, attempt.period):
            _change_kind(conn, attempt, counter)
        elif counter.period < attempt.period:
            roll_over(conn, account_id=attempt.account_id, metric=attempt.metric, period=attempt.period)
        elif counter.period > attempt.period:  # another server's clock already opened the next period
            attempt = replace(attempt, period=counter.period)
    # the counter kept changing (releases racing the diagnosis): refuse with the last state seen
    raise _exhausted(attempt, counter, "the counter kept changing during the take; retry")


def _take(conn: Connection, attempt: _Attempt) -> Take | None:
    """The hot path: one statement that moves the counter and writes its ledger row, or nothing. On
    Citus, the same take as one call that Citus delegates to the account's node (`take_delegated`:
    the statement there is planned as coordinator steps, README "Scaling out")."""
    delegated = on_citus(conn)
    try:
        with conn.cursor(row_factory=class_row(Take)) as cur:
            granted = cur.execute(Q.take_delegated if delegated else Q.take, vars(attempt)).fetchone()
    except psycopg.errors.UniqueViolation:
        return None  # the key was taken by an earlier (or concurrent, now committed) take
    return None if granted is None or granted.take_id is None else granted


# Per database (host, port, name): whether it is a Citus cluster, asked on its first take.
_ON_CITUS: dict[tuple[str, int, str], bool] = {}
# Each connection's database key, read once per connection: every read of conn.info.host, port or
# dbname is a call into libpq and a decoding, three of them on every take otherwise.
_DATABASE_OF: weakref.WeakKeyDictionary[Connection, tuple[str, int, str]] = weakref.WeakKeyDictionary()


def on_citus(conn: Connection) -> bool:
    """Whether `conn`'s database has the citus extension; asked once per database and process."""
    key = _DATABASE_OF.get(conn)
    if key is None:
        key = _DATABASE_OF[conn] = (conn.info.host, conn.info.port, conn.info.dbname)
    found = _ON_CITUS.get(key)
    if found is None:
        row = conn.execute(Q.on_citus).fetchone()
        found = _ON_CITUS[key] = bool(row and row[0])
    return found


def _replay(conn: Connection, attempt: _Attempt) -> Take | None:
    """The earlier take of this idempotency key, if any; IdempotencyKeyReused if it took other units."""
    if attempt.idempotency_key is None:
        return None
    with conn.cursor(row_factory=class_row(Take)) as cur:
        earlier = cur.execute(Q.take_by_key, vars(attempt)).fetchone()
    if earlier is None:
        return None
    if (earlier.metric, earlier.units) != (attempt.metric, attempt.units):
        raise IdempotencyKeyReused(take_id=earlier.take_id)
    return replace(earlier, replayed=True)


def _refusal(conn: Connection, attempt: _Attempt) -> _Counter:
    """Why the take statement matched nothing. Raises what the client must be told (UnknownAccount,
    AccountDeleted, QuotaExhausted); returns the counter when the refusal is one to mend."""
    with conn.cursor(row_factory=class_row(_Counter)) as cur:
        counter = cur.execute(Q.take_refusal, vars(attempt)).fetchone()
    if counter is None:
        raise UnknownAccount(f"unknown account {attempt.account_id!r}")
    if counter.deleted:
        raise AccountDeleted(f"account {attempt.account_id!r} was deleted")
    if counter.period == attempt.period and counter.limit is not None:
        assert counter.used is not None  # a counter row has both
        if counter.used + attempt.units > counter.limit:
            raise _exhausted(
                attempt,
                counter,
                f"{attempt.metric}: {attempt.units} more would exceed the limit of {counter.limit}",
            )
    return counter


def _change_kind(conn: Connection, attempt: _Attempt, counter: _Counter) -> None:
    """The counter is in a period of another kind than its metric's in the plan config now (month,
    day, held): moved to the metric's period if it holds nothing, else MetricKindChanged."""
    refuse_kind_change(attempt.metric, counter, attempt.period)
    roll_over(conn, account_id=attempt.account_id, metric=attempt.metric, period=attempt.period)


def refuse_kind_change(metric: str, counter: _Counter, period: str) -> None:
    """MetricKindChanged if the counter holds usage counted in a period of another kind than
    `period`'s: moving it would clear or carry that usage (`convert-metric` does it knowingly)."""
    if counter.used and counter.period is not None and not periods.same_kind(counter.period, period):
        raise MetricKindChanged(
            f"{metric}: the counter holds {counter.used} counted in period {counter.period}, "
            f"but the plan config now counts this metric in periods like {period}; run "
            f"`quota-ledger convert-metric {metric}`"
        )


def _create_counter(conn: Connection, plans: PlanConfig, attempt: _Attempt) -> None:
    """The account has no counter for this metric yet (created lazily, with its plan's limits)."""
    ensure_quotas(conn, plans, account_id=attempt.account_id, period=attempt.period)


def roll_over(
    conn: Connection, *, account_id: str, metric: str, period: str, actor: str = ROLLOVER_ACTOR
) -> None:
    """Open `period` on a counter still in an earlier period (or in a period of another kind): from
    zero, with the reset row of what it cleared (none if it held nothing). A counter already in
    `period`, or in a later one, is left alone."""
    params = {"account_id": account_id, "metric": metric, "period": period, "actor": actor}
    conn.execute(Q.roll_over, params)


def _exhausted(attempt: _Attempt, counter: _Counter, message: str) -> QuotaExhausted:
    used, limit = counter.used or 0, counter.limit
    return QuotaExhausted(
        message,
        used=used,
        limit=limit,
        remaining=None if limit is None else max(limit - used, 0),
        period=periods.shown(attempt.period),
        limit_source=counter.limit_source,
    )


def release(
    conn: Connection, *, take_id: int, actor: str, period: str | None = None, account_id: str | None = None
) -> Release:
    """Give back a take's units, once. A take from a closed period (an allocation's never closes) or
    already released moves
    nothing and says why; an unknown take (or one of another account than `account_id`) raises
    UnknownTake. Naming the account keeps a release on its shard under Citus; without it, the
    take's account is looked up first. `period` is the day of the release (default: today, UTC) or
    a month: a take of that day or month, or an allocation's, is given back."""
    period = period or periods.day_of(periods.now())
    if account_id is None:
        found = conn.execute(Q.take_account, {"take_id": take_id}).fetchone()
        if found is None:
            raise UnknownTake(f"unknown take {take_id}")
        account_id = str(found[0])
    params = {"take_id": take_id, "period": period, "actor": actor, "account_id": account_id}
    try:
        with conn.cursor(row_factory=class_row(Release)) as cur:
            done = cur.execute(Q.release, params).fetchone()
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
    return Release(
        released=False, take_id=take_id, reason="period_closed", counter_period=why["counter_period"]
    )


def read_counter(conn: Connection, *, account_id: str, metric: str) -> _Counter | None:
    """The counter a take of `metric` would move, with the account's deleted flag, in the one read
    by key that explains a refused take (`take_refusal`); None: no such account. The check's read
    (service/quota/check.py): what it answers is what this take would meet."""
    with conn.cursor(row_factory=class_row(_Counter)) as cur:
        return cur.execute(Q.take_refusal, {"account_id": account_id, "metric": metric}).fetchone()
