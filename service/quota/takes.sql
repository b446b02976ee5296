-- Takes, releases and the lazy rollover (service/quota/takes.py). Parameters are named (%(x)s).
-- Every statement here is keyed by account_id.

-- name: take
-- The hot path, one statement: ledger_take (migrations/repeatable/ledger_writers.sql) moves the
-- counter and writes its ledger row, or matches nothing (no row back). A duplicate idempotency key
-- raises a unique violation, which rolls the counter back too.
SELECT take_id, metric, units, used, "limit", period AS counter_period, limit_source
  FROM ledger_take(%(account_id)s::text, %(metric)s::text, %(units)s::bigint, %(period)s::text,
                   %(idempotency_key)s::text, %(actor)s::text)

-- name: take_each
-- A batch's takes (takes.py take_each), one statement and one transaction: ledger_take_each
-- (migrations/repeatable/ledger_writers.sql) takes each item as `take` would, or says why not (the
-- counter it met, and the live grants' credits when its allowance had no room; `key_met`: the item's
-- key is taken already). Items are parallel arrays; one row per item, in item order (`item` counts
-- from 1). Not on Citus: one transaction, many shards.
SELECT item, granted, key_met, take_id, used, "limit", counter_period, limit_source, deleted, credits
  FROM ledger_take_each(%(account_ids)s::text[], %(metrics)s::text[], %(units)s::bigint[], %(periods)s::text[],
                        %(keys)s::text[], %(actor)s::text)
 ORDER BY item

-- name: take_refusal
-- Why did `take` match nothing? Read after the fact; the caller retries where the answer allows.
-- `credits`: what the live grants have left, read only when the allowance has no room (live_grants,
-- migrations/repeatable/grants.sql): a take they may cover is tried with them before it is refused.
SELECT a.deleted, q.period, q.used, q.lim AS "limit", q.limit_source,
       CASE WHEN q.used + coalesce(%(units)s, 1) > q.lim
            THEN (SELECT coalesce(sum(lg.remaining), 0)::bigint FROM live_grants lg
                   WHERE lg.account_id = %(account_id)s AND lg.metric = %(metric)s)
            ELSE 0 END AS credits
  FROM accounts a
  LEFT JOIN quotas q ON q.account_id = a.id AND q.metric = %(metric)s
 WHERE a.id = %(account_id)s

-- name: take_lines
-- A multi-line take, one statement: ledger_take_lines (migrations/repeatable/ledger_writers.sql)
-- grants every line (one row per line, in the order given) or none (no row back). Lines are
-- parallel arrays: metrics (distinct), units, periods.
SELECT take_id, metric, units, used, "limit", period AS counter_period, limit_source
  FROM ledger_take_lines(%(account_id)s::text, %(metrics)s::text[], %(units)s::bigint[], %(periods)s::text[],
                         %(idempotency_key)s::text, %(actor)s::text)

-- name: take_by_key
-- The take(s) an idempotency key names: a single take's row, or each line's of a multi-line take,
-- in line order (take_line_key, migrations/repeatable/ledger_writers.sql). Off the hot path: read
-- only after a take statement was refused or met the key.
-- A take that drew on grants (its allowance share filled the counter) counts its draws, the
-- grant_take rows that follow it in its counter's chain (migrations/repeatable/grants.sql).
SELECT t.id AS take_id, t.metric, t.units + coalesce(d.units, 0) AS units, t.used_after AS used,
       t.lim AS "limit", t.period AS counter_period, t.limit_source, coalesce(d.units, 0) AS from_credits
  FROM ledger t
  LEFT JOIN LATERAL (
        SELECT sum(g.units)::bigint AS units FROM ledger g
         WHERE g.account_id = %(account_id)s AND g.metric = t.metric AND g.seq > t.seq
           AND g.seq <= t.seq + 1000 AND g.kind = 'grant_take' AND g.take_id = t.id
           AND t.used_after >= t.lim) AS d ON true
 WHERE t.account_id = %(account_id)s AND t.kind = 'take'
   AND t.idempotency_key = ANY(take_line_keys(%(idempotency_key)s::text))
 ORDER BY array_position(take_line_keys(%(idempotency_key)s::text), t.idempotency_key)

-- name: roll_over
-- Lazy rollover of one counter into `period`, with the ledger row of what it cleared
-- (ledger_roll_over, migrations/repeatable/ledger_writers.sql).
SELECT ledger_roll_over(%(account_id)s::text, %(metric)s::text, %(period)s::text, %(actor)s::text)

-- name: release
-- Gives a take's units back, once, in the take's own period only (ledger_release,
-- migrations/repeatable/ledger_writers.sql). Named by account and take, so that Citus routes it to
-- one shard (take_account finds the account of a take named alone).
SELECT released, take_id, account_id, metric, units, used, "limit", period AS counter_period, limit_source,
       release_id
  FROM ledger_release(%(account_id)s::text, %(take_id)s::bigint, %(period)s::text, %(actor)s::text)

-- name: release_refusal
-- Why `release` gave nothing back: released already, another period, or a take that drew on grants
-- (`drew_credits`: its draws follow it in its counter's chain), which release_credits gives back.
SELECT t.account_id, t.period AS counter_period,
       EXISTS (SELECT 1 FROM ledger r
                WHERE r.account_id = %(account_id)s AND r.kind = 'release' AND r.take_id = t.id) AS released,
       t.lim IS NOT NULL AND t.used_after >= t.lim
       AND EXISTS (SELECT 1 FROM ledger d
                    WHERE d.account_id = %(account_id)s AND d.metric = t.metric AND d.seq = t.seq + 1
                      AND d.kind = 'grant_take' AND d.take_id = t.id) AS drew_credits
  FROM ledger t
 WHERE t.account_id = %(account_id)s AND t.id = %(take_id)s AND t.kind = 'take'

-- name: release_credits
-- The release of a take that drew on grants: grants first, newest draw first, then the allowance
-- (ledger_release_credits, migrations/repeatable/grants.sql); no row back as `release`.
SELECT released, take_id, account_id, metric, units, used, "limit", period AS counter_period, limit_source,
       release_id
  FROM ledger_release_credits(%(account_id)s::text, %(take_id)s::bigint, %(period)s::text, %(actor)s::text)

-- name: take_account
-- The account of a take named by its id alone (the route without the account): on Citus, the one
-- statement of a release that asks every shard, by the ledger_id index on each.
SELECT account_id FROM ledger WHERE id = %(take_id)s AND kind = 'take'

-- name: take_delegated
-- The take as one call of take_delegated (migrations/repeatable/take_delegated.sql), which Citus
-- delegates to the account's node; the service uses it on a Citus cluster only. A refused take
-- returns one row of NULLs.
SELECT take_id, metric, units, used, "limit", period AS counter_period, limit_source
  FROM take_delegated(%(account_id)s::text, %(metric)s::text, %(units)s::bigint, %(period)s::text,
                      %(idempotency_key)s::text, %(actor)s::text)

-- name: on_citus
-- Whether this database is a Citus cluster: asked once per database by the service.
SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') AS on_citus

-- name: take_credits
-- A take (one line, or a multi-line take's lines) with the account's live grants after the
-- allowance, all or nothing (ledger_take_credits, migrations/repeatable/grants.sql); only after the
-- take's own statement refused it for want of room. No row back: it does not fit even so.
SELECT take_id, metric, units, used, "limit", period AS counter_period, limit_source, from_credits
  FROM ledger_take_credits(%(account_id)s::text, %(metrics)s::text[], %(units)s::bigint[], %(periods)s::text[],
                           %(idempotency_key)s::text, %(actor)s::text)
