-- Finance reads of the ledger and the audit log (service/quota/ledger.py).

-- name: ledger_page
-- A page after a cursor (the last id seen), in id order: a stable order to page by. Ids are unique
-- but not a counter's chain order (on Citus each node draws from its own range): seq is.
SELECT id, at, account_id, metric, period, kind, units, used_after, lim, take_id, idempotency_key, actor,
       prev_hash, hash, seq, grant_id
  FROM ledger
 WHERE id > %(after)s
   AND (%(account_id)s::text IS NULL OR account_id = %(account_id)s)
   AND (%(metric)s::text IS NULL OR metric = %(metric)s)
   AND (%(period)s::text IS NULL OR period = %(period)s)
   AND (%(kind)s::text IS NULL OR kind = %(kind)s)
 ORDER BY id
 LIMIT %(limit)s

-- name: ledger_period_rows
-- A period's export, counter by counter in chain order (seq), so each row follows the row it links
-- to: id order is not that order on Citus (a take's id is drawn on its worker, a release's on the
-- coordinator). A month's export includes its days (the periods of daily metrics): they sort
-- between the month and the month followed by '.' (service/quota/periods.py), day after day, in the
-- ledger_period index's order.
SELECT id, at, account_id, metric, period, kind, units, used_after, lim, take_id, idempotency_key, actor,
       prev_hash, hash, seq, grant_id
  FROM ledger
 WHERE period >= %(period)s AND period < %(period)s || '.'
 ORDER BY period, account_id, metric, seq

-- name: export_idle_timeout
-- SET LOCAL as a function, so that it takes a parameter: the setting ends with the transaction (also
-- behind a transaction pooler, where a session SET would outlive it on a shared server connection).
SELECT set_config('idle_in_transaction_session_timeout', %(ms)s, true)

-- name: reconciliation
-- Counter vs ledger for one period (a month with its days, as ledger_period_rows; a day; or `held`,
-- the allocations, never reset: all their takes minus releases). For each counter and period: used
-- must equal Σtake − Σrelease over the period's rows after its latest reset row, and the last row's
-- used_after must equal that sum too (the chain of used_after values is unbroken). Counters that
-- moved on to a later period are checked through their rows; counters still in the period also
-- against their `used`.
-- Shaped so that no plan can hinge on the row estimate of the period, which is badly low right
-- after the monthly reset wrote it: one pass over the period's rows (the latest reset found by a
-- window over the same sort the aggregate needs, not by joining the rows back to themselves, which
-- a planner expecting one row runs as a nested loop: quadratic), then a FULL JOIN, which Postgres
-- can only run as a hash or merge join.
WITH rows AS (
    SELECT account_id, metric, period, seq, kind, units, used_after,
           max(seq) FILTER (WHERE kind = 'reset') OVER (PARTITION BY account_id, metric, period) AS reset_seq
      FROM ledger
     WHERE period >= %(period)s AND period < %(period)s || '.'
), sums AS (
    SELECT account_id, metric, period,
           coalesce(sum(CASE kind WHEN 'take' THEN units WHEN 'release' THEN -units ELSE 0 END)
                        FILTER (WHERE seq > coalesce(reset_seq, 0)), 0)::bigint AS ledger_used,
           (array_agg(used_after ORDER BY seq DESC))[1] AS last_used_after
      FROM rows
     GROUP BY account_id, metric, period
), counters AS (
    SELECT account_id, metric, period::text, used FROM quotas
     WHERE period >= %(period)s AND period < %(period)s || '.'
)
SELECT account_id, metric, period, c.used AS counter_used, coalesce(s.ledger_used, 0) AS ledger_used,
       s.last_used_after
  FROM counters c FULL JOIN sums s USING (account_id, metric, period)
 ORDER BY account_id, metric, period

-- name: grant_reconciliation
-- Grant vs ledger for the grants with a row in the period (as `reconciliation` reads the period): a
-- grant's remaining must equal units - taken + released - voided - expired over all its rows, read
-- along its counter's rows (the ledger has no index on grant_id, which every take's insert would
-- pay for). A forfeit moves nothing: the grant had ended. Every join is on account_id, so Citus
-- runs the whole query on each shard.
WITH touched AS (
    SELECT DISTINCT account_id, metric, grant_id
      FROM ledger
     WHERE period >= %(period)s AND period < %(period)s || '.' AND grant_id IS NOT NULL
), sums AS (
    SELECT l.account_id, l.grant_id,
           coalesce(sum(CASE l.kind WHEN 'grant' THEN l.units WHEN 'grant_release' THEN l.units
                                    WHEN 'grant_take' THEN -l.units WHEN 'grant_void' THEN -l.units
                                    WHEN 'grant_expire' THEN -l.units ELSE 0 END), 0)::bigint AS ledger_remaining
      FROM ledger l
      JOIN touched t ON l.account_id = t.account_id AND l.metric = t.metric AND l.grant_id = t.grant_id
     GROUP BY l.account_id, l.grant_id
)
SELECT g.account_id, g.metric, g.id AS grant_id, g.remaining, s.ledger_remaining
  FROM sums s
  JOIN grants g ON g.account_id = s.account_id AND g.id = s.grant_id
 ORDER BY g.account_id, g.id

-- name: audit_page
SELECT id, at, actor, action, nullif(account_id, '') AS account_id, metric, old, new
  FROM audit_log
 WHERE id > %(after)s
   AND (%(account_id)s::text IS NULL OR account_id = %(account_id)s)
 ORDER BY id
 LIMIT %(limit)s

-- name: ledger_recent
-- An account's latest rows, newest id first, on the primary key (account_id, id).
SELECT id, at, account_id, metric, period, kind, units, used_after, lim, take_id, idempotency_key, actor,
       prev_hash, hash, seq
  FROM ledger
 WHERE account_id = %(account_id)s
 ORDER BY id DESC
 LIMIT %(limit)s
