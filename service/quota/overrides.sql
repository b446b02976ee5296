-- Sticky overrides (service/quota/overrides.py), the only writer of the override columns.

-- name: quota_for_update
SELECT plan_limit, free_limit, override_set, override_limit, lapsed
  FROM quotas
 WHERE account_id = %(account_id)s AND metric = %(metric)s
   FOR UPDATE

-- name: set_override
UPDATE quotas
   SET override_set = %(override_set)s, override_limit = %(override_limit)s
 WHERE account_id = %(account_id)s AND metric = %(metric)s
