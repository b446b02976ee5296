-- The take statement as the service ran it before its writers became SECURITY DEFINER functions
-- (service/quota/takes.sql at main 16a72a0, issue 21): the base side `before` of bench/take_fn_ab.py.
-- Run as the tables' owner there. Not part of the service.
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
