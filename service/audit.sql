-- The audit log (service/audit.py): append-only, one row per admin action or plan-limit change.

-- name: audit
-- audit_append (migrations/repeatable/ledger_writers.sql): the service's role cannot insert directly.
SELECT audit_append(%(actor)s::text, %(action)s::text, %(account_id)s::text, %(metric)s::text, %(old)s::jsonb,
                    %(new)s::jsonb)
