"""The ledger's hash chain: its canonical form, and the walk that verifies it.

Every ledger row carries `hash = sha256(prev_hash || canonical fields)`, where `prev_hash` is the
hash of the previous row of the same counter (account, metric), NULL for a counter's first row.
A counter's rows are in chain order by `seq` (1, 2, 3 ..., migrations/0015), not by id: ids are only
unique. The counter's row in `quotas` holds the head (`chain_id`, `chain_seq`, `chain_hash`). The
docs/ledger.md ("The hash chain") documents the canonical form for finance's own tools.

`seq` is not hashed: the walk follows seq, so a row removed, inserted or moved breaks a prev_hash
link (or, at the end, the head), and a seq rewritten alone leaves a gap or a repeat in 1, 2, 3 ...
Beyond the hashes, each row must follow from the one before it as the writers write it: `at` and
`period` never go back, and `used_after` is what the row's kind leaves from the previous row's (see
`_follows`), so that a row forged with a correct hash (by a role that can compute one) still shows.
The walk covers every counter the ledger holds, with or without a head in `quotas`.

The writers compute the hash in SQL (`ledger_hash()`, migrations/0009). This module computes it
again in Python on purpose: verification must not trust code stored in the database it checks
(a superuser able to rewrite rows can rewrite a function too). A test holds the two to the same
result.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from psycopg.rows import namedtuple_row

from service.db import Connection, Q, transaction
from service.quota.takes import on_citus

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
PROGRESS_EVERY = 100_000  # rows between progress callbacks
PAGE_ACCOUNTS = 1_000  # accounts per page of the whole-ledger walk
KEEP_FINDINGS = 10_000  # findings kept in Verification.findings; every one goes to on_finding
# A reset row that opens a period carries this key + the period (takes.sql roll_over, reset.sql).
PERIOD_OPEN = "period-open:"
# How far `at` may go back along a chain on a Citus cluster: there a writer that runs from the
# coordinator has its clock_timestamp() evaluated there before its UPDATE reaches the shard and waits
# for the row lock, so a row can be stamped a little before the one it follows (up to 0.12 s was seen
# under the tests' races). On one PostgreSQL `at` is drawn under the row lock: no slack.
CITUS_AT_SLACK = timedelta(seconds=60)


def epoch_us(at: datetime) -> int:
    """`at` as whole microseconds since the Unix epoch, the form the canonical message uses."""
    return (at - EPOCH) // _MICROSECOND


def fields(*values: object) -> bytes:
    """Values as the canonical form writes them: each as text, `<length in UTF-8 bytes>:<text>`, a
    None as a lone `:`, concatenated and encoded in UTF-8."""
    parts = []
    for value in values:
        if value is None:
            parts.append(":")
        else:
            text = str(value)
            parts.append(f"{len(text.encode())}:{text}")
    return "".join(parts).encode()


def canonical(row: Any) -> bytes:
    """The canonical message of a ledger row (anything with the ledger's column names as attributes):
    id, at, account_id, metric, period, kind, units, used_after, lim, take_id, idempotency_key, actor,
    in `fields` form, and a grant's row's grant_id after them (a row without one: nothing more)."""
    grant_id = getattr(row, "grant_id", None)
    return fields(
        row.id,
        epoch_us(row.at),
        row.account_id,
        row.metric,
        row.period,
        row.kind,
        row.units,
        row.used_after,
        row.lim,
        row.take_id,
        row.idempotency_key,
        row.actor,
    ) + (b"" if grant_id is None else fields(grant_id))


def row_hash(prev_hash: bytes | None, row: Any) -> bytes:
    """sha256(prev_hash || canonical(row)); a counter's first row has no prev_hash."""
    return hashlib.sha256((prev_hash or b"") + canonical(row)).digest()


def short(h: bytes | None) -> str:
    return "NULL" if h is None else h.hex()[:16] + "…"


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One break in a counter's chain: the row (None: the counter's head) and what differs."""

    account_id: str
    metric: str
    row_id: int | None
    problem: str

    def describe(self) -> str:
        where = f"row {self.row_id}" if self.row_id is not None else "head"
        account = self.account_id or "''"  # the empty id, which no writer of the service writes
        return f"account {account} {self.metric} {where}: {self.problem}"


@dataclass(frozen=True, kw_only=True)
class Head:
    """A counter's chain as the walk found it: its rows, and its last row's position and hash."""

    account_id: str
    metric: str
    rows: int
    seq: int
    hash: bytes


@dataclass(kw_only=True)
class Verification:
    """rows: rows checked (anchors before --since are read, not counted); breaks: every finding,
    of which `findings` keeps the first KEEP_FINDINGS; broken_accounts: accounts with one or more."""

    rows: int = 0
    counters: int = 0
    accounts: int = 0
    breaks: int = 0
    broken_accounts: int = 0
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.breaks == 0


def _link(prev: Any, row: Any) -> str | None:
    """The row's place in its chain: linked to the previous row's hash, at the next seq."""
    expected_prev = None if prev is None else prev.hash
    if row.prev_hash != expected_prev:
        if prev is None:
            return (
                f"prev_hash {short(row.prev_hash)} but no earlier row of this counter: "
                "earlier rows were removed"
            )
        return (
            f"prev_hash {short(row.prev_hash)} is not the hash of the counter's previous row {prev.id} "
            f"({short(prev.hash)}): a row between them was removed or inserted, or a hash was rewritten"
        )
    expected_seq = 1 if prev is None else prev.seq + 1
    if row.seq != expected_seq:
        after = "as the counter's first row" if prev is None else f"after row {prev.id} (seq {prev.seq})"
        return (
            f"seq {row.seq} where {expected_seq} was expected {after}: the chain positions were rewritten, "
            "or a row's position is repeated or missing"
        )
    return None


def _time(prev: Any, row: Any, slack: timedelta) -> Iterator[str]:
    """`at` (by more than `slack`) and `period` never go back along the chain; a counter enters
    another period either through its period-open reset row or holding nothing (a counter that held
    nothing is moved on without a row)."""
    opens = row.kind == "reset" and row.idempotency_key is not None
    if opens and row.idempotency_key != PERIOD_OPEN + row.period:
        yield f"a reset with key {row.idempotency_key!r} in period {row.period}: a period-open key names it"
    if prev is None:
        if opens:
            yield "a period-open reset as the counter's first row: there was nothing to clear"
        return
    if row.at < prev.at - slack:
        allowed = f", more than the {slack.total_seconds():g} s a cluster allows" if slack else ""
        yield (
            f"at {row.at.isoformat()} is before the previous row {prev.id}'s ({prev.at.isoformat()})"
            f"{allowed}: a row's time was rewritten or a row moved (or the clock of the database node "
            "that wrote it was stepped back)"
        )
    # Periods of one kind sort in time (periods.py); a counter whose metric changed kind (month, day,
    # held) enters the other kind's period as it enters a new period: empty, or by a period-open row.
    if len(row.period) == len(prev.period) and row.period < prev.period:
        yield f"period {row.period} after the previous row {prev.id}'s {prev.period}: a chain never goes back"
    elif row.period != prev.period and not opens and prev.used_after != 0:
        yield (
            f"period {row.period} entered from {prev.period} while the counter held {prev.used_after} "
            f"(row {prev.id}) without a period-open reset row"
        )


def _follows(prev: Any, row: Any) -> str | None:
    """`units` and `used_after` as the writers compute them from the counter's previous value (the
    previous row's used_after; 0 before the first): a take adds its units within the limit it was
    granted against, a release gives back at most what is held, a reset clears what was held."""
    before = 0 if prev is None else prev.used_after
    source = "an empty counter" if prev is None else f"row {prev.id} (used_after {before})"
    if row.kind.startswith("grant"):  # a grant's row leaves the counter as it was (README "Credits")
        if getattr(row, "grant_id", None) is None:
            return f"a {row.kind} row that names no grant"
        if row.used_after != before:
            return (
                f"a {row.kind} row leaving {row.used_after} does not follow from {source}: it moves no usage"
            )
    elif row.kind == "take":
        if row.used_after != before + row.units:
            return (
                f"used_after {row.used_after} does not follow from {source}: a take of {row.units} "
                f"leaves {before + row.units}"
            )
        # a take the allowance gave nothing to (all from grants) leaves a counter over its limit as it was
        if row.lim is not None and row.used_after > row.lim and row.units > 0:
            return f"used_after {row.used_after} is over the limit {row.lim} the take was granted against"
    elif row.kind == "release":
        if row.units > before or row.used_after != before - row.units:
            return (
                f"a release of {row.units} leaving {row.used_after} does not follow from {source}: "
                f"a release gives back at most what is held, and leaves the rest"
            )
    elif row.units != before or row.used_after != 0:
        return (
            f"a reset clearing {row.units} and leaving {row.used_after} does not follow from {source}: "
            f"a reset clears {before} and leaves 0"
        )
    return None


def _grant_balance(balances: dict[int, int], row: Any) -> str | None:
    """A grant's row against what its earlier rows left it (README "Credits"): a draw, a void or an
    expiry takes at most what is left, an expiry all of it. `balances`: the counter's grants seen
    created in this walk (a walk from --since may start after a grant's creation: not checked)."""
    kind, grant_id, units = row.kind, getattr(row, "grant_id", None), row.units
    if grant_id is None:
        return None
    if kind == "grant":
        if grant_id in balances:
            return f"grant {grant_id} created a second time"
        balances[grant_id] = units
        return None
    left = balances.get(grant_id)
    if left is None:
        return None
    if kind == "grant_release":
        balances[grant_id] = left + units
    elif kind in ("grant_take", "grant_void", "grant_expire"):
        if units > left or (kind == "grant_expire" and units != left):
            return f"a {kind} of {units} where grant {grant_id} had {left} left"
        balances[grant_id] = left - units
    return None


def _check(prev: Any, row: Any, slack: timedelta) -> Sequence[str]:
    """Everything wrong with `row` given the previous row of its counter in seq order (None: it is
    the first, or the first after `since` with no row before it)."""
    computed = row_hash(row.prev_hash, row)
    if (  # the common row, a take after a row of its period, that holds: said without the detail
        prev is not None
        and computed == row.hash
        and row.prev_hash == prev.hash
        and row.seq == prev.seq + 1
        and row.kind == "take"
        and row.period == prev.period
        and row.used_after == prev.used_after + row.units
        and (row.lim is None or row.used_after <= row.lim)
        and (row.at >= prev.at or row.at >= prev.at - slack)
    ):
        return ()
    return list(_problems(prev, row, slack, computed))


def _problems(prev: Any, row: Any, slack: timedelta, computed: bytes) -> Iterator[str]:
    """_check's detail, each rule on its own (`computed`: the row's hash recomputed)."""
    if row.hash is None:
        yield "no hash: written by a writer that does not chain"
    link = _link(prev, row)
    if link is not None:
        yield link
    if row.hash is not None and computed != row.hash:
        yield (
            f"fields do not match the row's hash (stored {short(row.hash)}, recomputed {short(computed)}): "
            "a field was changed after the row was written"
        )
    yield from _time(prev, row, slack)
    follows = _follows(prev, row)
    if follows is not None:
        yield follows


@dataclass(frozen=True, kw_only=True)
class _Page:
    """A part of the walk: its query and parameters; `heads`: its heads' query, or None (--since)."""

    query: str
    params: dict[str, Any]
    heads: dict[str, Any] | None


def _pages(conn: Connection, account_id: str | None, since: int) -> Iterator[_Page]:
    """The walk's parts: from `since`, one query (its rows are what was asked for); otherwise page by
    page of PAGE_ACCOUNTS accounts (chain_walk_next says why), or one page for one account."""
    if since > 0:
        yield _Page(query=Q.chain_walk_since, params={"account_id": account_id, "since": since}, heads=None)
        return
    start = ""
    while True:
        following = None
        if account_id is None:
            with conn.cursor(row_factory=namedtuple_row) as cur:
                end: Any = cur.execute(
                    Q.chain_walk_next, {"start": start, "accounts": PAGE_ACCOUNTS}
                ).fetchone()
            following = None if end is None else end.next
        params = {"account_id": account_id, "start": start, "next": following}
        yield _Page(query=Q.chain_walk, params=params, heads=params)
        if following is None:
            return
        start = following


def _stream(conn: Connection, query: str, params: dict[str, Any]) -> Iterator[Any]:
    """A query's rows by a server-side cursor, so this process holds few rows at a time however
    many an account has."""
    with conn.cursor(name="chain_walk", row_factory=namedtuple_row) as cur:
        cur.itersize = 5000
        yield from cur.execute(query, params)


@dataclass(frozen=True, kw_only=True)
class _Last:
    """A counter's last row as chain_heads reads it (id, seq, hash)."""

    id: int
    seq: int
    hash: bytes


def _head_problem(head: Any, last: Any) -> str | None:
    """A head (quotas.chain_*) against the last row the walk found for its counter (None: none)."""
    last_id, last_seq, last_hash = (None, 0, None) if last is None else (last.id, last.seq, last.hash)
    if (head.chain_id, head.chain_seq, head.chain_hash) == (last_id, last_seq, last_hash):
        return None
    return (
        f"the counter's head names row {head.chain_id} (seq {head.chain_seq}, {short(head.chain_hash)}) "
        f"but its last row is {last_id} (seq {last_seq}, {short(last_hash)}): rows were removed from the "
        "end of the chain, or the head was rewritten"
    )


def _headless(rows: int, last_seq: int, last_id: int | None = None) -> str:
    last = f"last row {last_id}, seq {last_seq}" if last_id is not None else f"last seq {last_seq}"
    return (
        f"the ledger holds {rows} row(s) of this counter ({last}) but it has no head (no quotas row): "
        "a chain written outside the service's counters"
    )


def verify(
    conn: Connection,
    *,
    account_id: str | None = None,
    since: int = 0,
    pinned: Mapping[tuple[str, str], tuple[int, bytes]] | None = None,
    on_progress: Callable[[int], None] | None = None,
    on_finding: Callable[[Finding], None] | None = None,
    on_counter: Callable[[Head], None] | None = None,
) -> Verification:
    """Walk every counter's chain the ledger holds (or one account's) in seq order, checking each
    row's hash, link, position, time, period and numbers against the previous row; then check every
    counter's head against its last row, and report a counter of the ledger that has no head.
    Every break is reported (to `on_finding` as found, in walk order), not only an account's first.

    With `since`, each counter's chain is walked from its first row whose id is >= `since` to its
    head (the row before it is read as the anchor, not checked): ids are unique but, on Citus, not
    in write order across nodes, so `since` picks where each walk starts and the rest of that chain
    is checked whatever its ids. `pinned` (account, metric) -> (seq, hash): rows that must still be
    in their chains unchanged (a checkpoint's heads); not with `since`, which does not read them.
    `on_counter` gets each walked counter's Head (in full walks, every counter with rows).
    One REPEATABLE READ snapshot for all of it, so concurrent takes cause no false finding."""
    if pinned is not None and since > 0:
        raise ValueError("pinned rows are checked by a whole walk, not with since")
    result = Verification()
    broken: set[str] = set()
    pins = dict(pinned or {})

    def found(account: str, metric: str, row_id: int | None, problem: str) -> None:
        finding = Finding(account_id=account, metric=metric, row_id=row_id, problem=problem)
        result.breaks += 1
        if account not in broken:
            broken.add(account)
            result.broken_accounts += 1
        if len(result.findings) < KEEP_FINDINGS:
            result.findings.append(finding)
        if on_finding is not None:
            on_finding(finding)

    with transaction(conn):
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        # On Citus, one connection per node for the whole transaction, hence one snapshot per node
        # (a second connection would take its own): a counter's rows and head are on one node.
        # One PostgreSQL only stores the setting.
        conn.execute("SET LOCAL citus.max_adaptive_executor_pool_size = 1")
        slack = CITUS_AT_SLACK if on_citus(conn) else timedelta(0)
        account: str | None = None
        for page in _pages(conn, account_id, since):
            lasts: dict[tuple[str, str], tuple[Any, int]] = {}  # counter -> (its last row, its rows)
            # kept for the page's heads and on_counter only: a --since walk is one page of every
            # counter written since, whose last rows this process need not hold
            track = page.heads is not None or on_counter is not None
            key: tuple[str, str] | None = None
            prev: Any = None
            count = 0
            balances: dict[int, int] = {}  # the counter's grants: what each has left so far
            row: Any
            for row in _stream(conn, page.query, page.params):
                if row.account_id != account:
                    account = row.account_id
                    result.accounts += 1
                if (row.account_id, row.metric) != key:
                    if key is not None and track:
                        lasts[key] = (prev, count)
                    key, prev, count, balances = (row.account_id, row.metric), None, 0, {}
                pin = pins.get(key)
                if pin is not None and pin[0] == row.seq:
                    del pins[key]
                    if pin[1] != row.hash:
                        found(
                            row.account_id,
                            row.metric,
                            row.id,
                            f"the row at seq {row.seq} has hash {short(row.hash)} where the checkpoint "
                            f"has {short(pin[1])}: the chain was rewritten since",
                        )
                if row.anchor:
                    prev = row
                    continue
                if prev is None or prev.anchor:
                    result.counters += 1
                result.rows += 1
                count += 1
                if on_progress is not None and result.rows % PROGRESS_EVERY == 0:
                    on_progress(result.rows)
                for problem in _check(prev, row, slack):
                    found(row.account_id, row.metric, row.id, problem)
                if row.grant_id is not None and (balance := _grant_balance(balances, row)) is not None:
                    found(row.account_id, row.metric, row.id, balance)
                prev = row
            if key is not None and track:
                lasts[key] = (prev, count)
            if on_counter is not None:
                for (a, m), (last, rows) in lasts.items():
                    if rows:
                        on_counter(Head(account_id=a, metric=m, rows=rows, seq=last.seq, hash=last.hash))
            if page.heads is not None:
                _check_page_heads(conn, page.heads, lasts, found)
        if since > 0:
            _check_heads_since(conn, {"account_id": account_id, "since": since}, found)
        for (a, m), (seq, _) in sorted(pins.items()):
            if account_id is None or a == account_id:
                found(
                    a,
                    m,
                    None,
                    f"the checkpoint's row at seq {seq} is gone: the chain was cut back or removed",
                )
    return result


def _check_page_heads(
    conn: Connection,
    params: dict[str, Any],
    lasts: dict[tuple[str, str], tuple[Any, int]],
    found: Callable[[str, str, int | None, str], None],
) -> None:
    """A page's heads against the last rows the walk found; then its counters with no head."""
    with conn.cursor(row_factory=namedtuple_row) as cur:
        head: Any
        for head in cur.execute(Q.chain_page_heads, params):
            last, _ = lasts.pop((head.account_id, head.metric), (None, 0))
            problem = _head_problem(head, last)
            if problem is not None:
                found(head.account_id, head.metric, None, problem)
    for (a, m), (last, rows) in lasts.items():
        found(a, m, None, _headless(rows, last.seq, last.id))


def _check_heads_since(
    conn: Connection, params: dict[str, Any], found: Callable[[str, str, int | None, str], None]
) -> None:
    with conn.cursor(row_factory=namedtuple_row) as cur:
        head: Any
        for head in cur.execute(Q.chain_heads, params):
            last = (
                None
                if head.last_id is None
                else _Last(id=head.last_id, seq=head.last_seq, hash=head.last_hash)
            )
            problem = _head_problem(head, last)
            if problem is not None:
                found(head.account_id, head.metric, None, problem)
        c: Any
        for c in cur.execute(Q.chain_headless_since, params).fetchall():
            found(c.account_id, c.metric, None, _headless(c.rows, c.last_seq))
