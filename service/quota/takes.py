"""Take and release: the only ways a counter moves between resets, each with its ledger row."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, replace

import psycopg
from psycopg.rows import class_row, dict_row

from service.db import Connection, Q, pipelined
from service.errors import (
    AccountDeleted,
    IdempotencyKeyReused,
    MetricKindChanged,
    QuotaError,
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
    from_credits: int = 0  # units drawn from grants (README "Credits"); the rest from the allowance

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
    credits: int = 0  # what the account's live grants of the metric have left (README "Credits")


class _CreditsMayCover(Exception):
    """The allowance has no room for the take, but the live grants may: the take with credits
    (ledger_take_credits) is tried before the client is told `short`."""

    def __init__(self, short: QuotaExhausted) -> None:
        super().__init__(short.message)
        self.short = short


@dataclass(frozen=True, kw_only=True)
class _Item:
    """A batch item's row of the take_each statement: granted, the take's numbers; refused, the
    counter it met (`deleted` None: no such account); `key_met`: not taken, its key is used already."""

    item: int
    granted: bool
    key_met: bool
    take_id: int | None
    used: int | None
    limit: int | None
    counter_period: str | None
    limit_source: str | None
    deleted: bool | None
    credits: int = 0  # the live grants' remaining when the allowance had no room (else 0)

    @property
    def counter(self) -> _Counter | None:
        if self.deleted is None:
            return None
        return _Counter(
            deleted=self.deleted,
            period=self.counter_period,
            used=self.used,
            limit=self.limit,
            limit_source=self.limit_source,
            credits=self.credits,
        )

    def take(self, attempt: _Attempt) -> Take:
        assert self.take_id is not None and self.used is not None and self.counter_period is not None
        return Take(
            take_id=self.take_id,
            metric=attempt.metric,
            units=attempt.units,
            used=self.used,
            limit=self.limit,
            counter_period=self.counter_period,
            limit_source=str(self.limit_source),
        )


# A take that meets a counter to mend (not created yet, last month's, next month's) or a release
# that freed room since the statement goes round again; more passes than that means the counter
# keeps changing under it.
MAX_PASSES = 4
# The most lines one multi-line take may have (take_line_keys in ledger_writers.sql knows as many).
MAX_LINES = 20


@dataclass(frozen=True, kw_only=True)
class Line:
    """One line of a multi-line take: `units` of `metric`."""

    metric: str
    units: int = 1


@dataclass(frozen=True, kw_only=True)
class TakeItem:
    """One take of a batch (`take_each`), as a single take names it."""

    account_id: str
    metric: str
    units: int = 1
    idempotency_key: str | None = None


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
    return _take_alone(
        conn, plans, _attempt(plans, account_id, metric, units, idempotency_key, actor, period)
    )


def _take_alone(conn: Connection, plans: PlanConfig, attempt: _Attempt) -> Take:
    granted = _take(conn, attempt)
    return granted if granted is not None else _after_refusal(conn, plans, attempt)


def _attempt(
    plans: PlanConfig,
    account_id: str,
    metric: str,
    units: int,
    idempotency_key: str | None,
    actor: str,
    period: str | None,
) -> _Attempt:
    require_metric(plans, metric)
    return _Attempt(
        account_id=account_id,
        metric=metric,
        units=units,
        period=period or plans.period(metric),
        idempotency_key=idempotency_key,
        actor=actor,
    )


def _after_refusal(conn: Connection, plans: PlanConfig, attempt: _Attempt, seen: _Item | None = None) -> Take:
    """A single take whose statement matched nothing: the original take of its key, or the counter
    mended (`_mend`) and the statement again, or what the client must be told. `seen`: the counter
    as the refused statement met it, when it read it (a batch's take_each)."""
    for _ in range(MAX_PASSES):
        earlier = _replay(conn, attempt)
        if earlier is not None:
            return earlier
        try:
            attempt, counter = _mend(conn, plans, attempt, seen)
        except _CreditsMayCover as may:
            with_credits = _take_credits(conn, [attempt])
            if with_credits:
                return with_credits[0]
            earlier = None if with_credits is not None else _replay(conn, attempt)  # the key met a take
            if earlier is not None:
                return earlier
            raise may.short from None
        seen = None
        granted = _take(conn, attempt)
        if granted is not None:
            return granted
    # the counter kept changing (releases racing the diagnosis): refuse with the last state seen
    raise _exhausted(attempt, counter, "the counter kept changing during the take; retry")


def _mend(
    conn: Connection, plans: PlanConfig, attempt: _Attempt, seen: _Item | None = None
) -> tuple[_Attempt, _Counter]:
    """Why a take's statement matched nothing, mended where a take may mend it: the counter created
    (with its plan's limits), rolled over into the attempt's period, or moved to the metric's kind.
    Raises what the client must be told (`_refusal`; MetricKindChanged). Returns the attempt to make
    again (in the next period when another server's clock already opened it) and the counter seen.
    `seen`: the counter read already (else it is read now)."""
    counter = _refusal(conn, attempt) if seen is None else _judged(attempt, seen.counter)
    if counter.period is None:
        _create_counter(conn, plans, attempt)
    elif not periods.same_kind(counter.period, attempt.period):
        _change_kind(conn, attempt, counter)
    elif counter.period < attempt.period:
        roll_over(conn, account_id=attempt.account_id, metric=attempt.metric, period=attempt.period)
    elif counter.period > attempt.period:  # another server's clock already opened the next period
        attempt = replace(attempt, period=counter.period)
    return attempt, counter


def take_lines(
    conn: Connection,
    plans: PlanConfig,
    *,
    account_id: str,
    lines: Sequence[Line],
    idempotency_key: str | None = None,
    actor: str,
) -> list[Take]:
    """Take every line or none: one take per line (each released on its own), in the order given.
    `lines` name distinct metrics, of any kinds (1 to MAX_LINES). Refused: QuotaExhausted whose
    `lines` names every line that did not fit, and nothing is taken; UnknownAccount, AccountDeleted,
    UnknownMetric, MetricKindChanged as a single take. With an idempotency key already used by this
    account for the same lines, returns the original takes; for anything else, IdempotencyKeyReused.
    Each line's counter is made ready as a single take's is (`_mend`). Call on an autocommit
    connection: the grant is one statement (ledger_take_lines)."""
    attempts = [
        _attempt(plans, account_id, line.metric, line.units, idempotency_key, actor, None) for line in lines
    ]
    if not 1 <= len(attempts) <= MAX_LINES or len({a.metric for a in attempts}) < len(attempts):
        raise ValueError(f"a multi-line take names 1 to {MAX_LINES} distinct metrics")
    short: list[tuple[_Attempt, QuotaExhausted]] = []
    covered = False  # every short line is one the live grants may cover
    for _ in range(MAX_PASSES):
        granted = _take_lines(conn, attempts)
        if granted:
            return granted
        earlier = _replay_lines(conn, attempts)
        if earlier is not None:
            return earlier
        short, mended, covered = [], False, True
        for i, attempt in enumerate(attempts):
            try:
                attempts[i], counter = _mend(conn, plans, attempt)
            except QuotaExhausted as e:
                short.append((attempt, e))
                covered = False
                continue
            except _CreditsMayCover as may:
                short.append((attempt, may.short))
                continue
            mended = mended or counter.period != attempt.period
        if short and not mended:  # every counter was in its period: these lines do not fit
            if covered:  # unless the live grants cover them
                with_credits = _take_credits(conn, attempts)
                if with_credits:
                    return with_credits
                earlier = None if with_credits is not None else _replay_lines(conn, attempts)
                if earlier is not None:  # the key met an earlier take
                    return earlier
            break
    raise _lines_exhausted(short)


def _take_lines(conn: Connection, attempts: list[_Attempt]) -> list[Take]:
    """The multi-line take's one statement: a take per line, in the order given, or none."""
    try:
        with conn.cursor(row_factory=class_row(Take)) as cur:
            return cur.execute(Q.take_lines, _lines_params(attempts)).fetchall()
    except psycopg.errors.UniqueViolation:
        return []  # a line's key was taken by an earlier (or concurrent, now committed) take


def _lines_params(attempts: list[_Attempt]) -> dict[str, object]:
    """One account's lines as the multi-line statements take them: parallel arrays, one key."""
    first = attempts[0]
    return {
        "account_id": first.account_id,
        "metrics": [a.metric for a in attempts],
        "units": [a.units for a in attempts],
        "periods": [a.period for a in attempts],
        "idempotency_key": first.idempotency_key,
        "actor": first.actor,
    }


def _take_credits(conn: Connection, attempts: list[_Attempt]) -> list[Take] | None:
    """The take (one line, or every line of a multi-line take) with the account's live grants after
    the allowance, all or nothing (ledger_take_credits, migrations/repeatable/grants.sql). Called only
    after the take's own statement refused it for want of room: the fast path stays one statement.
    [] : it does not fit even so; None: its idempotency key met an earlier take."""
    try:
        with conn.cursor(row_factory=class_row(Take)) as cur:
            return cur.execute(Q.take_credits, _lines_params(attempts)).fetchall()
    except psycopg.errors.UniqueViolation:
        return None


def _replay_lines(conn: Connection, attempts: list[_Attempt]) -> list[Take] | None:
    """The original takes of this key, in the order of these lines; IdempotencyKeyReused if the key
    was used for other lines, or by a single take of other units."""
    earlier = _by_key(conn, attempts[0])
    if not earlier:
        return None
    asked = {a.metric: a.units for a in attempts}
    if len(earlier) != len(attempts) or any(asked.get(t.metric) != t.units for t in earlier):
        raise IdempotencyKeyReused(take_id=earlier[0].take_id)
    by_metric = {t.metric: replace(t, replayed=True) for t in earlier}
    return [by_metric[a.metric] for a in attempts]


def take_each(
    conn: Connection, plans: PlanConfig, items: Sequence[TakeItem], *, actor: str
) -> list[Take | QuotaError]:
    """Each item exactly as `take` of it would answer (the take, or the domain error it would raise),
    in item order; the items are independent (not atomic: each is granted or refused on its own).
    They are taken in one statement and one transaction (take_each); an item refused there (or whose
    key is used already) goes on as a single take's refusal does, one by one, after that commit. On
    Citus, or when that statement failed (a key used concurrently, a lock cycle), the items go one
    statement each, still in one round trip (`_take_one_by_one`)."""
    results: list[Take | QuotaError | None] = [None] * len(items)
    pending: list[tuple[int, _Attempt]] = []
    for i, item in enumerate(items):
        try:
            attempt = _attempt(
                plans, item.account_id, item.metric, item.units, item.idempotency_key, actor, None
            )
        except QuotaError as e:
            results[i] = e
            continue
        pending.append((i, attempt))
    answers: Sequence[Take | _Item | None] | None = None
    if pending and not on_citus(conn):
        answers = _take_together(conn, [a for _, a in pending])
    if answers is None:
        answers = _take_one_by_one(conn, [a for _, a in pending])
    for (i, attempt), answer in zip(pending, answers, strict=True):
        try:
            if isinstance(answer, Take):
                results[i] = answer
            elif answer is not None and answer.granted:
                results[i] = answer.take(attempt)
            else:
                seen = answer if answer is not None and not answer.key_met else None
                results[i] = _after_refusal(conn, plans, attempt, seen)
        except QuotaError as e:
            results[i] = e
    return [r for r in results if r is not None]


def _take_together(conn: Connection, attempts: list[_Attempt]) -> list[_Item] | None:
    """The batch's one statement (take_each): a row per attempt, in order; None when it was undone
    (a key taken concurrently between its look-up and its INSERT, or a deadlock), nothing written."""
    params = {
        "account_ids": [a.account_id for a in attempts],
        "metrics": [a.metric for a in attempts],
        "units": [a.units for a in attempts],
        "periods": [a.period for a in attempts],
        "keys": [a.idempotency_key for a in attempts],
        "actor": attempts[0].actor,
    }
    try:
        with conn.cursor(row_factory=class_row(_Item)) as cur:
            return cur.execute(Q.take_each, params).fetchall()
    except (psycopg.errors.UniqueViolation, psycopg.errors.DeadlockDetected):
        return None


def _take_one_by_one(conn: Connection, attempts: list[_Attempt]) -> list[Take | None]:
    """Each attempt's take statement, its own transaction, all in one round trip (`pipelined`): the
    take, or None when refused (or failed: a key met), for the caller to go on as a single take."""
    query = Q.take_delegated if on_citus(conn) else Q.take
    answers = pipelined(conn, query, [vars(a) for a in attempts], row_factory=class_row(Take))
    return [None if rows is None or not rows else _granted(rows[0]) for rows in answers]


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
    return _granted(granted)


def _granted(row: Take | None) -> Take | None:
    """A take statement's row as a granted take; None: refused (take_delegated's row of NULLs too)."""
    return None if row is None or row.take_id is None else row


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
    """The earlier take of this idempotency key, if any; IdempotencyKeyReused if it took other units,
    or was a multi-line take of more than one line."""
    earlier = _by_key(conn, attempt)
    if not earlier:
        return None
    if len(earlier) > 1 or (earlier[0].metric, earlier[0].units) != (attempt.metric, attempt.units):
        raise IdempotencyKeyReused(take_id=earlier[0].take_id)
    return replace(earlier[0], replayed=True)


def _by_key(conn: Connection, attempt: _Attempt) -> list[Take]:
    """The takes of the attempt's idempotency key: one single take's, or each line's, in line order."""
    if attempt.idempotency_key is None:
        return []
    with conn.cursor(row_factory=class_row(Take)) as cur:
        return cur.execute(Q.take_by_key, vars(attempt)).fetchall()


def _lines_exhausted(short: list[tuple[_Attempt, QuotaExhausted]]) -> QuotaExhausted:
    """The refusal of a multi-line take: every line that did not fit, with its counter's numbers."""
    if not short:  # the counters kept changing during the take
        return QuotaExhausted("the counters kept changing during the take; retry", lines=[])
    return QuotaExhausted(
        "; ".join(e.message for _, e in short),
        lines=[
            {
                "metric": a.metric,
                "units": a.units,
                "remaining": e.details["remaining"],
                "limit": e.details["limit"],
            }
            for a, e in short
        ],
    )


def _refusal(conn: Connection, attempt: _Attempt) -> _Counter:
    """Why the take statement matched nothing. Raises what the client must be told (UnknownAccount,
    AccountDeleted, QuotaExhausted); returns the counter when the refusal is one to mend."""
    with conn.cursor(row_factory=class_row(_Counter)) as cur:
        return _judged(attempt, cur.execute(Q.take_refusal, vars(attempt)).fetchone())


def _judged(attempt: _Attempt, counter: _Counter | None) -> _Counter:
    """`_refusal` of the counter read (None: no such account)."""
    if counter is None:
        raise UnknownAccount(f"unknown account {attempt.account_id!r}")
    if counter.deleted:
        raise AccountDeleted(f"account {attempt.account_id!r} was deleted")
    if counter.period == attempt.period and counter.limit is not None:
        assert counter.used is not None  # a counter row has both
        if counter.used + attempt.units > counter.limit:
            message = f"{attempt.metric}: {attempt.units} more would exceed the limit of {counter.limit}"
            if max(counter.limit - counter.used, 0) + counter.credits >= attempt.units:
                raise _CreditsMayCover(_exhausted(attempt, counter, message))
            raise _exhausted(attempt, counter, message)
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
    # `release`; refused, the reason; a take that drew on grants and is not released yet goes once
    # more through `release_credits`, and is judged by the reason read after that.
    for query in (Q.release, Q.release_credits):
        try:
            with conn.cursor(row_factory=class_row(Release)) as cur:
                done = cur.execute(query, params).fetchone()
        except psycopg.errors.UniqueViolation:
            done = None  # a concurrent release of the same take committed first
        if done is not None:
            return done
        with conn.cursor(row_factory=dict_row) as cur:
            why = cur.execute(Q.release_refusal, params).fetchone()
        if why is None or not why["drew_credits"] or why["released"]:
            break
    if why is None:
        raise UnknownTake(f"unknown take {take_id}")
    if why["released"]:
        return Release(released=False, take_id=take_id, reason="already_released")
    return Release(
        released=False, take_id=take_id, reason="period_closed", counter_period=why["counter_period"]
    )


def read_counter(conn: Connection, *, account_id: str, metric: str, units: int = 1) -> _Counter | None:
    """The counter a take of `metric` would move, with the account's deleted flag, in the one read
    by key that explains a refused take (`take_refusal`); None: no such account. The check's read
    (service/quota/check.py): what it answers is what this take would meet."""
    with conn.cursor(row_factory=class_row(_Counter)) as cur:
        params = {"account_id": account_id, "metric": metric, "units": units}
        return cur.execute(Q.take_refusal, params).fetchone()
