-- The audit log (service/audit.py): append-only, one row per admin action or plan-limit change.

-- name: audit
-- audit_append (migrations/repeatable/ledger_writers.sql), the owner's alone (keys): the service's role
-- appends audit rows only through the functions that make the change they record.
SELECT audit_append(%(actor)s::text, %(action)s::text, %(account_id)s::text, %(metric)s::text, %(old)s::jsonb,
                    %(new)s::jsonb)
