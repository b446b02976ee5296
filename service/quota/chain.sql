-- The ledger's hash chain, read for verification (service/quota/chain.py). Writers chain in their
-- own statements (takes.sql, admin.sql, reset.sql) through ledger_hash() (migrations/0009).

-- name: chain_walk_next
-- Where the whole-ledger walk's next page starts: the account id %(accounts)s accounts after
-- %(start)s; no row once fewer are left (the last page then runs to the ledger's end). Pages are
-- half-open ranges of account ids, [start, next), the first starting at '' and the last open, so
-- that they cover every account id the ledger may hold, whether `accounts` holds it or not ('' and
-- ids past the last account included). Paged by account range so that on Citus the coordinator
-- holds one page of rows at a time rather than gathering the whole ledger before the walk starts:
-- each shard answers this from its accounts' primary key, and the page's rows come from the
-- ledger's (account_id, metric, seq) index on each shard.
SELECT id AS next FROM accounts WHERE id >= %(start)s ORDER BY id OFFSET %(accounts)s LIMIT 1

-- name: chain_walk
-- One page of rows to check: the account ids in [start, next) (next NULL: to the end), or one
-- account; each counter's rows in chain order (seq, migrations/0015). A page holds whole accounts.
SELECT id, at, seq, account_id, metric, period, kind, units, used_after, lim, take_id, idempotency_key,
       actor, prev_hash, hash, grant_id, false AS anchor
  FROM ledger
 WHERE (%(account_id)s::text IS NULL OR account_id = %(account_id)s)
   AND account_id >= %(start)s AND (%(next)s::text IS NULL OR account_id < %(next)s)
 ORDER BY account_id, metric, seq

-- name: chain_page_heads
-- The heads (quotas.chain_*) of one page's counters, compared in Python with the last row the walk
-- found for each: a counter of the ledger with no head, or a head with no rows, shows there too.
SELECT account_id, metric, chain_id, chain_seq, chain_hash
  FROM quotas
 WHERE (%(account_id)s::text IS NULL OR account_id = %(account_id)s)
   AND account_id >= %(start)s AND (%(next)s::text IS NULL OR account_id < %(next)s)

-- name: chain_walk_since
-- Each counter's chain from its first row (in seq) with id >= `since` to its head, every row of it
-- whatever its own id (ids are unique, not ordered: a Citus worker draws from its own range), plus,
-- as an anchor that is not itself checked, the row just before in seq: the first checked row links to
-- its hash. Grouped by the account and joined on it, so Citus pushes the whole walk down to the
-- shards, where each counter's rows live.
SELECT l.id, l.at, l.seq, l.account_id, l.metric, l.period, l.kind, l.units, l.used_after, l.lim,
       l.take_id, l.idempotency_key, l.actor, l.prev_hash, l.hash, l.grant_id, l.seq = c.first - 1 AS anchor
  FROM ledger l
  JOIN (SELECT account_id, metric, min(seq) AS first
          FROM ledger
         WHERE id >= %(since)s AND (%(account_id)s::text IS NULL OR account_id = %(account_id)s)
         GROUP BY account_id, metric) AS c
    ON l.account_id = c.account_id AND l.metric = c.metric AND l.seq >= c.first - 1
 ORDER BY account_id, metric, seq

-- name: chain_heads
-- With `since`: counters whose head (quotas.chain_*) is not their last ledger row in chain order
-- (rows removed from the end of a chain, or a head rewritten), every counter's, walked or not.
SELECT q.account_id, q.metric, q.chain_id, q.chain_seq, q.chain_hash, l.id AS last_id, l.seq AS last_seq,
       l.hash AS last_hash
  FROM quotas q
  LEFT JOIN LATERAL (
        SELECT id, seq, hash FROM ledger
         WHERE account_id = q.account_id AND metric = q.metric
         ORDER BY seq DESC
         LIMIT 1) AS l ON true
 WHERE (%(account_id)s::text IS NULL OR q.account_id = %(account_id)s)
   AND (q.chain_id IS DISTINCT FROM l.id OR q.chain_hash IS DISTINCT FROM l.hash
        OR q.chain_seq IS DISTINCT FROM coalesce(l.seq, 0))
 ORDER BY q.account_id, q.metric

-- name: chain_headless_since
-- With `since`: the counters written since that have no head (no quotas row), so that no chain
-- outside the service's counters passes unseen. Read from the rows since only (the ledger_id index).
SELECT l.account_id, l.metric, count(*) AS rows, max(l.seq) AS last_seq
  FROM ledger l
 WHERE l.id >= %(since)s AND (%(account_id)s::text IS NULL OR l.account_id = %(account_id)s)
   AND NOT EXISTS (SELECT FROM quotas q WHERE q.account_id = l.account_id AND q.metric = l.metric)
 GROUP BY l.account_id, l.metric
 ORDER BY l.account_id, l.metric
