-- Admin actions on an account (service/quota/admin.py): reset a counter, soft delete, restore.

-- name: admin_reset
-- Clears the counter of the open period; the ledger row names the admin key and the value cleared.
-- Locked first so `prior.used` is exactly what is cleared.
WITH prior AS (
    SELECT account_id, metric, used
      FROM quotas
     WHERE account_id = %(account_id)s AND metric = %(metric)s AND period = %(period)s
       FOR UPDATE
), cleared AS (
    UPDATE quotas q
       SET used = 0, chain_seq = q.chain_seq + 1,
           (chain_prev, chain_id, chain_at, chain_hash) = (
               SELECT q.chain_hash, e.id, e.at,
                      ledger_hash(q.chain_hash, e.id, e.at, q.account_id, q.metric, %(period)s, 'reset',
                                  prior.used, 0, NULL, NULL, NULL, %(actor)s)
                 FROM (SELECT nextval('ledger_id_seq') AS id, clock_timestamp() AS at) AS e)
      FROM prior
     WHERE q.account_id = %(account_id)s AND q.account_id = prior.account_id AND q.metric = prior.metric
 RETURNING q.account_id, q.metric, prior.used AS previous, q.chain_id, q.chain_at, q.chain_seq, q.chain_prev, q.chain_hash
)
INSERT INTO ledger (id, at, seq, account_id, metric, period, kind, units, used_after, actor, prev_hash, hash)
OVERRIDING SYSTEM VALUE
SELECT chain_id, chain_at, chain_seq, account_id, metric, %(period)s, 'reset', previous, 0, %(actor)s, chain_prev, chain_hash
  FROM cleared
RETURNING id, units AS previous

-- name: soft_delete_account
-- No row back: unknown, or deleted already (then nothing happened, and nothing is to be audited).
UPDATE accounts SET deleted = true, updated_at = now()
 WHERE id = %(account_id)s AND NOT deleted
RETURNING id

-- name: soft_delete_quotas
UPDATE quotas SET account_deleted = true WHERE account_id = %(account_id)s

-- name: restore_account
-- Only a deleted account is restored (no row back: it was not deleted, or does not exist).
UPDATE accounts SET deleted = false, updated_at = now()
 WHERE id = %(account_id)s AND deleted
RETURNING id

-- name: restore_quotas
UPDATE quotas SET account_deleted = false WHERE account_id = %(account_id)s
