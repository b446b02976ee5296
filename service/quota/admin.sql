-- Admin actions on an account (service/quota/admin.py): reset a counter, soft delete, restore.

-- name: admin_reset
-- Clears the counter of the open period; the ledger row names the admin key and the value cleared
-- (ledger_admin_reset, migrations/repeatable/ledger_writers.sql). No row: no counter in the period.
SELECT * FROM ledger_admin_reset(%(account_id)s::text, %(metric)s::text, %(period)s::text, %(actor)s::text)

-- name: account_set_deleted
-- Soft delete (deleted true) or restore: the account's flag, its counters' copy, and the audit row, in
-- one call (account_set_deleted, migrations/repeatable/ledger_writers.sql). False: nothing changed
-- (unknown, or as asked already), and nothing is audited.
SELECT account_set_deleted(%(account_id)s::text, %(deleted)s::boolean, %(actor)s::text) AS changed
