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
-- counter it met; `key_met`: the item's key is taken already). Items are parallel arrays; one row
-- per item, in item order (`item` counts from 1). Not on Citus: one transaction, many shards.
SELECT item, granted, key_met, take_id, used, "limit", counter_period, limit_source, deleted
  FROM ledger_take_each(%(account_ids)s::text[], %(metrics)s::text[], %(units)s::bigint[], %(periods)s::text[],
                        %(keys)s::text[], %(actor)s::text)
 ORDER BY item

-- name: take_refusal
-- Why did `take` match nothing? Read after the fact; the caller retries where the answer allows.
SELECT a.deleted, q.period, q.used, q.lim AS "limit", q.limit_source
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
SELECT id AS take_id, metric, units, used_after AS used, lim AS "limit", period AS counter_period, limit_source
  FROM ledger
 WHERE account_id = %(account_id)s AND kind = 'take'
   AND idempotency_key = ANY(take_line_keys(%(idempotency_key)s::text))
 ORDER BY array_position(take_line_keys(%(idempotency_key)s::text), idempotency_key)

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
SELECT t.account_id, t.period AS counter_period,
       EXISTS (SELECT 1 FROM ledger r
                WHERE r.account_id = %(account_id)s AND r.kind = 'release' AND r.take_id = t.id) AS released
  FROM ledger t
 WHERE t.account_id = %(account_id)s AND t.id = %(take_id)s AND t.kind = 'take'

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
