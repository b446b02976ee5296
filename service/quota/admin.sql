-- Admin actions on an account (service/quota/admin.py): reset a counter, soft delete, restore.

-- name: admin_reset
-- Clears the counter of the open period; the ledger row names the admin key and the value cleared
-- (ledger_admin_reset, migrations/repeatable/ledger_writers.sql). No row: no counter in the period.
SELECT * FROM ledger_admin_reset(%(account_id)s::text, %(metric)s::text, %(period)s::text, %(actor)s::text)

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
