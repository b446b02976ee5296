"""The ledger's hash chain: its canonical form, and the walk that verifies it.

Every ledger row carries `hash = sha256(prev_hash || canonical fields)`, where `prev_hash` is the
hash of the previous row of the same counter (account, metric), NULL for a counter's first row.
A counter's rows are in chain order by `seq` (1, 2, 3 ..., migrations/0015), not by id: ids are only
unique. The counter's row in `quotas` holds the head (`chain_id`, `chain_seq`, `chain_hash`). The
README ("The ledger's hash chain") documents the canonical form for finance's own tools.

`seq` is not hashed: the walk follows seq, so a row removed, inserted or moved breaks a prev_hash
link (or, at the end, the head), and a seq rewritten alone leaves a gap or a repeat in 1, 2, 3 ...

The writers compute the hash in SQL (`ledger_hash()`, migrations/0009). This module computes it
again in Python on purpose: verification must not trust code stored in the database it checks
(a superuser able to rewrite rows can rewrite a function too). A test holds the two to the same
result.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from psycopg.rows import namedtuple_row

from service.db import Connection, Q, transaction

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
PROGRESS_EVERY = 100_000  # rows between progress callbacks
PAGE_ACCOUNTS = 1_000  # accounts per page of the whole-ledger walk


def epoch_us(at: datetime) -> int:
    """`at` as whole microseconds since the Unix epoch, the form the canonical message uses."""
    return (at - EPOCH) // _MICROSECOND


def canonical(row: Any) -> bytes:
    """The canonical message of a ledger row (anything with the ledger's column names as attributes):
    id, at, account_id, metric, period, kind, units, used_after, lim, take_id, idempotency_key, actor,
    each as text written `<length in UTF-8 bytes>:<text>`, a NULL as a lone `:`, concatenated."""
    parts = []
    for value in (
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
    ):
        if value is None:
            parts.append(":")
        else:
            text = str(value)
            parts.append(f"{len(text.encode())}:{text}")
    return "".join(parts).encode()


def row_hash(prev_hash: bytes | None, row: Any) -> bytes:
    """sha256(prev_hash || canonical(row)); a counter's first row has no prev_hash."""
    return hashlib.sha256((prev_hash or b"") + canonical(row)).digest()


def short(h: bytes | None) -> str:
    return "NULL" if h is None else h.hex()[:16] + "…"


@dataclass(frozen=True, kw_only=True)
class Finding:
    """The first break found in one account's chains: the row (None: the counter's head) and what
    differs."""

    account_id: str
    metric: str
    row_id: int | None
    problem: str

    def describe(self) -> str:
        where = f"row {self.row_id}" if self.row_id is not None else "head"
        return f"account {self.account_id} {self.metric} {where}: {self.problem}"


@dataclass(kw_only=True)
class Verification:
    """rows: rows checked (anchors before --since are read, not counted); findings: the first break
    of each account that has one."""

    rows: int = 0
    counters: int = 0
    accounts: int = 0
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings


def _arithmetic_hint(prev: Any, row: Any) -> str:
    """When a row's fields no longer match its hash, say whether its numbers still follow from the
    previous row of its counter: points at `units` / `used_after` when they do not."""
    if prev is None or (prev.period != row.period and row.kind != "reset"):
        return ""
    if row.kind == "take":
        ok, expected = row.used_after == prev.used_after + row.units, f"{prev.used_after} + {row.units}"
    elif row.kind == "release":
        ok, expected = row.used_after == prev.used_after - row.units, f"{prev.used_after} - {row.units}"
    else:
        ok, expected = row.used_after == 0 and row.units == prev.used_after, f"units {prev.used_after}, 0"
    if ok:
        return ""
    return f"; units {row.units} / used_after {row.used_after} do not follow from row {prev.id} ({expected})"


def _check(prev: Any, row: Any) -> str | None:
    """What is wrong with `row` given the previous row of its counter in seq order (None: it is the
    first, or the first after `since` with no row before it)."""
    if row.hash is None:
        return "no hash: written by a writer that does not chain"
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
    computed = row_hash(row.prev_hash, row)
    if computed != row.hash:
        return (
            f"fields do not match the row's hash (stored {short(row.hash)}, recomputed {short(computed)}): "
            "a field was changed after the row was written" + _arithmetic_hint(prev, row)
        )
    return None


def _walk(conn: Connection, params: dict[str, Any]) -> Iterator[Any]:
    """The rows to check, in walk order: from `since`, one query (its rows are what was asked for);
    otherwise page by page of PAGE_ACCOUNTS accounts (chain_walk_upto says why), or one page for one
    account. Each streamed by a server-side cursor, so this process holds few rows at a time however
    many an account has."""
    if params["since"] > 0:
        yield from _stream(conn, Q.chain_walk_since, params)
        return
    after, upto = "", None
    while True:
        if params["account_id"] is None:
            with conn.cursor(row_factory=namedtuple_row) as cur:
                end: Any = cur.execute(
                    Q.chain_walk_upto, {"after": after, "accounts": PAGE_ACCOUNTS}
                ).fetchone()
            upto = None if end is None else end.upto
        yield from _stream(conn, Q.chain_walk, {**params, "after": after, "upto": upto})
        if upto is None:
            return
        after = upto


def _stream(conn: Connection, query: str, params: dict[str, Any]) -> Iterator[Any]:
    with conn.cursor(name="chain_walk", row_factory=namedtuple_row) as cur:
        cur.itersize = 5000
        yield from cur.execute(query, params)


def verify(
    conn: Connection,
    *,
    account_id: str | None = None,
    since: int = 0,
    on_progress: Callable[[int], None] | None = None,
) -> Verification:
    """Walk every counter's chain (or one account's) in seq order, recomputing each row's hash and
    checking its link to, and position after, the previous row; then check every counter's head
    against its last row. With `since`, each counter's chain is walked from its first row whose id
    is >= `since` to its head (the row before it is read as the anchor, not checked): ids are unique
    but, on Citus, not in write order across nodes, so `since` picks where each walk starts and the
    rest of that chain is checked whatever its ids. One REPEATABLE READ snapshot for both, so
    concurrent takes cause no false finding."""
    result = Verification()
    broken: set[str] = set()
    params = {"account_id": account_id, "since": since}
    with transaction(conn):
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        # On Citus, one connection per node for the whole transaction, hence one snapshot per node
        # (a second connection would take its own): a counter's rows and head are on one node.
        # One PostgreSQL only stores the setting.
        conn.execute("SET LOCAL citus.max_adaptive_executor_pool_size = 1")
        account: str | None = None
        last: dict[str, Any] = {}  # metric -> previous row, within the current account
        row: Any
        for row in _walk(conn, params):
            if row.account_id != account:
                account, last = row.account_id, {}
                result.accounts += 1
            prev = last.get(row.metric)
            last[row.metric] = row
            if row.anchor:
                continue
            if prev is None or prev.anchor:
                result.counters += 1
            result.rows += 1
            if on_progress is not None and result.rows % PROGRESS_EVERY == 0:
                on_progress(result.rows)
            if row.account_id in broken:
                continue
            problem = _check(prev, row)
            if problem is not None:
                broken.add(row.account_id)
                result.findings.append(
                    Finding(account_id=row.account_id, metric=row.metric, row_id=row.id, problem=problem)
                )
        with conn.cursor(row_factory=namedtuple_row) as cur:
            head: Any
            for head in cur.execute(Q.chain_heads, params):
                if head.account_id in broken:
                    continue
                broken.add(head.account_id)
                result.findings.append(
                    Finding(
                        account_id=head.account_id,
                        metric=head.metric,
                        row_id=None,
                        problem=(
                            f"the counter's head names row {head.chain_id} (seq {head.chain_seq}, "
                            f"{short(head.chain_hash)}) but its last row is {head.last_id} (seq "
                            f"{head.last_seq}, {short(head.last_hash)}): rows were removed from the end of "
                            "the chain, or the head was rewritten"
                        ),
                    )
                )
    result.findings.sort(key=lambda f: f.account_id)
    return result
