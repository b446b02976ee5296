-- The audit log (service/audit.py): append-only, one row per admin action or plan-limit change.

-- name: audit
INSERT INTO audit_log (actor, action, account_id, metric, old, new)
VALUES (%(actor)s, %(action)s, %(account_id)s, %(metric)s, %(old)s, %(new)s)
