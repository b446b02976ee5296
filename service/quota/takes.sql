-- Takes, releases and the lazy rollover (service/quota/takes.py). Parameters are named (%(x)s).
-- Every statement here is keyed by account_id.

-- name: take
-- The hot path, one statement: the conditional UPDATE re-checks `used + units <= lim` on the latest
-- row version under READ COMMITTED, so concurrent takes neither overshoot nor lose an update, and
-- the ledger row is written by the same statement. A duplicate idempotency key makes the INSERT
-- raise a unique violation, which aborts the whole statement, counter update included.
-- The row's chain position (chain_seq + 1), hash, id and time are drawn in the UPDATE's SET, which
-- Postgres evaluates again on the newest row version after a lock wait, so the row follows the
-- counter's head whatever the concurrency (migrations/0015); the id only has to be unique.
WITH granted AS (
    UPDATE quotas
       SET used = used + %(units)s, chain_seq = chain_seq + 1,
           (chain_prev, chain_id, chain_at, chain_hash) = (
               SELECT quotas.chain_hash, e.id, e.at,
                      ledger_hash(quotas.chain_hash, e.id, e.at, quotas.account_id, quotas.metric,
                                  quotas.period, 'take', %(units)s, quotas.used + %(units)s, quotas.lim,
                                  NULL, %(idempotency_key)s, %(actor)s)
                 FROM (SELECT nextval('ledger_id_seq') AS id, clock_timestamp() AS at) AS e)
     WHERE account_id = %(account_id)s AND metric = %(metric)s AND period = %(period)s
       AND NOT account_deleted
       AND (lim IS NULL OR used + %(units)s <= lim)
 RETURNING account_id, metric, period, used, lim, limit_source, chain_id, chain_at, chain_seq, chain_prev, chain_hash
), entry AS (
    INSERT INTO ledger (id, at, seq, account_id, metric, period, kind, units, used_after, lim, limit_source,
                        idempotency_key, actor, prev_hash, hash)
    OVERRIDING SYSTEM VALUE
    SELECT chain_id, chain_at, chain_seq, account_id, metric, period, 'take', %(units)s, used, lim, limit_source,
           %(idempotency_key)s, %(actor)s, chain_prev, chain_hash
      FROM granted
 RETURNING id, metric, period, units, used_after, lim, limit_source
)
SELECT id AS take_id, metric, units, used_after AS used, lim AS "limit", period, limit_source
  FROM entry

-- name: take_refusal
-- Why did `take` match nothing? Read after the fact; the caller retries where the answer allows.
SELECT a.deleted, q.period, q.used, q.lim AS "limit", q.limit_source
  FROM accounts a
  LEFT JOIN quotas q ON q.account_id = a.id AND q.metric = %(metric)s
 WHERE a.id = %(account_id)s

-- name: take_by_key
SELECT id AS take_id, metric, units, used_after AS used, lim AS "limit", period, limit_source
  FROM ledger
 WHERE account_id = %(account_id)s AND kind = 'take' AND idempotency_key = %(idempotency_key)s

-- name: roll_over
-- Lazy rollover of one counter into `period`, and the ledger row that records what it cleared.
-- FOR UPDATE reads the latest row version (and skips it if another statement rolled it over
-- first), so `prior.used` is exactly what this statement clears. A counter that held nothing
-- needs no reset row, so its chain does not move. The unique index on period-open keys makes a
-- second opening impossible.
WITH prior AS (
    SELECT account_id, metric, used
      FROM quotas
     WHERE account_id = %(account_id)s AND metric = %(metric)s AND period < %(period)s
       FOR UPDATE
), opened AS (
    UPDATE quotas q
       SET used = 0, period = %(period)s, chain_seq = q.chain_seq + 1,
           (chain_prev, chain_id, chain_at, chain_hash) = (
               SELECT q.chain_hash, e.id, e.at,
                      ledger_hash(q.chain_hash, e.id, e.at, q.account_id, q.metric, %(period)s, 'reset',
                                  prior.used, 0, NULL, NULL, 'period-open:' || %(period)s, %(actor)s)
                 FROM (SELECT nextval('ledger_id_seq') AS id, clock_timestamp() AS at) AS e)
      FROM prior
     WHERE q.account_id = %(account_id)s AND q.account_id = prior.account_id AND q.metric = prior.metric
       AND prior.used > 0
 RETURNING q.account_id, q.metric, prior.used AS cleared, q.chain_id, q.chain_at, q.chain_seq, q.chain_prev, q.chain_hash
), emptied AS (
    UPDATE quotas q
       SET period = %(period)s
      FROM prior
     WHERE q.account_id = %(account_id)s AND q.account_id = prior.account_id AND q.metric = prior.metric
       AND prior.used = 0
)
INSERT INTO ledger (id, at, seq, account_id, metric, period, kind, units, used_after, idempotency_key, actor,
                    prev_hash, hash)
OVERRIDING SYSTEM VALUE
SELECT chain_id, chain_at, chain_seq, account_id, metric, %(period)s, 'reset', cleared, 0, 'period-open:' || %(period)s,
       %(actor)s, chain_prev, chain_hash
  FROM opened

-- name: release
-- Gives a take's units back, once, in the take's own period only, never below zero. The counter row
-- is locked first so `held.used` is current; a concurrent second release of the same take fails on
-- the unique index (one release per take), which aborts its whole statement. Named by account and
-- take: every table is filtered on the account, so that Citus routes it to one shard (take_account
-- finds the account of a take named alone).
WITH taken AS (
    SELECT t.account_id, t.metric, t.period, t.units, t.id
      FROM ledger t
     WHERE t.account_id = %(account_id)s AND t.id = %(take_id)s AND t.kind = 'take' AND t.period = %(period)s
       AND NOT EXISTS (SELECT 1 FROM ledger r
                        WHERE r.account_id = %(account_id)s AND r.kind = 'release' AND r.take_id = t.id)
), held AS (
    SELECT q.account_id, q.metric, q.used, taken.units, taken.id AS take_id
      FROM quotas q JOIN taken ON q.account_id = taken.account_id AND q.metric = taken.metric
     WHERE q.account_id = %(account_id)s AND q.period = taken.period
       FOR UPDATE OF q
), given AS (
    -- greatest(..., 0) never changes what is written: `held` locked the newest row version, so there
    -- used >= what is given back. But when the row changed after this statement's snapshot, Postgres
    -- first evaluates SET on the version the snapshot saw, then finds it updated and evaluates again on
    -- the locked one; the quota_units domain check (migrations/0005) runs in that first evaluation,
    -- and a stale `used` below held.used would fail it spuriously (a release racing an admin reset).
    UPDATE quotas q
       SET used = greatest(q.used - least(held.units, held.used), 0), chain_seq = q.chain_seq + 1,
           (chain_prev, chain_id, chain_at, chain_hash) = (
               SELECT q.chain_hash, e.id, e.at,
                      ledger_hash(q.chain_hash, e.id, e.at, q.account_id, q.metric, q.period, 'release',
                                  least(held.units, held.used), q.used - least(held.units, held.used),
                                  NULL, held.take_id, NULL, %(actor)s)
                 FROM (SELECT nextval('ledger_id_seq') AS id, clock_timestamp() AS at) AS e)
      FROM held
     WHERE q.account_id = %(account_id)s AND q.account_id = held.account_id AND q.metric = held.metric
 RETURNING q.account_id, q.metric, q.period, q.used, q.lim, q.limit_source,
           least(held.units, held.used) AS units, held.take_id,
           q.chain_id, q.chain_at, q.chain_seq, q.chain_prev, q.chain_hash
), entry AS (
    INSERT INTO ledger (id, at, seq, account_id, metric, period, kind, units, used_after, take_id, actor,
                        prev_hash, hash)
    OVERRIDING SYSTEM VALUE
    SELECT chain_id, chain_at, chain_seq, account_id, metric, period, 'release', units, used, take_id, %(actor)s,
           chain_prev, chain_hash
      FROM given
 RETURNING id
)
SELECT true AS released, g.take_id, g.account_id, g.metric, g.units, g.used, g.lim AS "limit", g.period, g.limit_source,
       (SELECT id FROM entry) AS release_id
  FROM given g

-- name: release_refusal
SELECT t.account_id, t.period,
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
SELECT * FROM take_delegated(%(account_id)s::text, %(metric)s::text, %(units)s::bigint, %(period)s::text,
                             %(idempotency_key)s::text, %(actor)s::text)

-- name: on_citus
-- Whether this database is a Citus cluster: asked once per database by the service.
SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') AS on_citus
