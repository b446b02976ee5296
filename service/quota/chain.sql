-- The ledger's hash chain, read for verification (service/quota/chain.py). Writers chain in their
-- own statements (takes.sql, admin.sql, reset.sql) through ledger_hash() (migrations/0009).

-- name: chain_walk
-- Every row to check, account by account in id order: rows of one account are few enough to keep
-- one head per metric, so the walk holds one account at a time whatever the ledger's size.
SELECT id, at, account_id, metric, period, kind, units, used_after, lim, take_id, idempotency_key, actor,
       prev_hash, hash, false AS anchor
  FROM ledger
 WHERE (%(account_id)s::text IS NULL OR account_id = %(account_id)s)
 ORDER BY account_id, id

-- name: chain_walk_since
-- The rows from id `since` on, plus, as an anchor that is not itself checked, each counter's
-- newest row before `since`: the first checked row of a counter links to its hash. Each branch
-- reads the ledger itself (no CTE shared between them) and the anchor's subquery is correlated on
-- the account, so Citus pushes the whole walk down to the shards, where each counter's rows live.
SELECT id, at, account_id, metric, period, kind, units, used_after, lim, take_id, idempotency_key,
       actor, prev_hash, hash, false AS anchor
  FROM ledger
 WHERE id >= %(since)s AND (%(account_id)s::text IS NULL OR account_id = %(account_id)s)
UNION ALL
SELECT a.id, a.at, a.account_id, a.metric, a.period, a.kind, a.units, a.used_after, a.lim, a.take_id,
       a.idempotency_key, a.actor, a.prev_hash, a.hash, true AS anchor
  FROM (SELECT DISTINCT account_id, metric
          FROM ledger
         WHERE id >= %(since)s AND (%(account_id)s::text IS NULL OR account_id = %(account_id)s)) AS c
 CROSS JOIN LATERAL (
        SELECT id, at, account_id, metric, period, kind, units, used_after, lim, take_id, idempotency_key,
               actor, prev_hash, hash
          FROM ledger p
         WHERE p.account_id = c.account_id AND p.metric = c.metric AND p.id < %(since)s
         ORDER BY p.id DESC
         LIMIT 1) AS a
 ORDER BY account_id, id

-- name: chain_heads
-- Counters whose head (quotas.chain_*) is not their newest ledger row: rows removed from the end of
-- a chain, or a head rewritten.
SELECT q.account_id, q.metric, q.chain_id, q.chain_hash, l.id AS last_id, l.hash AS last_hash
  FROM quotas q
  LEFT JOIN LATERAL (
        SELECT id, hash FROM ledger
         WHERE account_id = q.account_id AND metric = q.metric
         ORDER BY id DESC
         LIMIT 1) AS l ON true
 WHERE (%(account_id)s::text IS NULL OR q.account_id = %(account_id)s)
   AND (q.chain_id IS DISTINCT FROM l.id OR q.chain_hash IS DISTINCT FROM l.hash)
 ORDER BY q.account_id, q.metric
