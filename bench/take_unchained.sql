-- The take statement as it was before the ledger's hash chain (migrations/0009), frozen here as the
-- chain-off side of bench/chain_bench.py: the same counter UPDATE and ledger INSERT, with no id
-- drawn in the UPDATE, no hash and no chain head. Runs on a copy of the schema whose ledger.hash
-- accepts NULL; never used by the service.
WITH granted AS (
    UPDATE quotas
       SET used = used + %(units)s
     WHERE account_id = %(account_id)s AND metric = %(metric)s AND period = %(period)s
       AND NOT account_deleted
       AND (lim IS NULL OR used + %(units)s <= lim)
 RETURNING account_id, metric, period, used, lim, limit_source
), entry AS (
    INSERT INTO ledger (account_id, metric, period, kind, units, used_after, lim, limit_source,
                        idempotency_key, actor)
    SELECT account_id, metric, period, 'take', %(units)s, used, lim, limit_source,
           %(idempotency_key)s, %(actor)s
      FROM granted
 RETURNING id, metric, period, units, used_after, lim, limit_source
)
SELECT id AS take_id, metric, units, used_after AS used, lim AS "limit", period, limit_source
  FROM entry
