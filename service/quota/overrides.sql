-- Sticky overrides (service/quota/overrides.py), the only writer of the override columns.

-- name: override_change
-- Sets (override_set) or clears the override and writes its audit row, in one call
-- (quota_set_override, migrations/repeatable/ledger_writers.sql). Answers the previous override; no
-- row: the account has no counter of the metric.
SELECT override_set, override_limit
  FROM quota_set_override(%(account_id)s::text, %(metric)s::text, %(override_set)s::boolean,
                          %(override_limit)s::bigint, %(actor)s::text)
