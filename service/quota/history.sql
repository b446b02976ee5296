-- An account's daily usage of one metric, from its ledger rows (service/quota/history.py).

-- name: usage_history_days
-- One row per UTC day that has ledger rows of the counter in [start, end): the units taken and
-- released that day, and the day's last row (in chain order) with its period: the counter as the
-- day ended. Read through ledger_history (account_id, metric, at) (migrations/0024).
SELECT (at AT TIME ZONE 'UTC')::date AS day,
       coalesce(sum(units) FILTER (WHERE kind = 'take'), 0)::bigint AS taken,
       coalesce(sum(units) FILTER (WHERE kind = 'release'), 0)::bigint AS released,
       (array_agg(used_after ORDER BY seq DESC))[1] AS used_after,
       (array_agg(period ORDER BY seq DESC))[1] AS period
  FROM ledger
 WHERE account_id = %(account_id)s AND metric = %(metric)s AND at >= %(start)s AND at < %(end)s
 GROUP BY 1
 ORDER BY 1

-- name: usage_history_before
-- The counter's last row before the range: what it held when the first day began.
SELECT used_after, period
  FROM ledger
 WHERE account_id = %(account_id)s AND metric = %(metric)s AND at < %(start)s
 ORDER BY at DESC, seq DESC
 LIMIT 1
