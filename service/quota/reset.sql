-- The monthly and daily resets (service/quota/reset.py): a job runs once per period (a month or a
-- day), in batches of counters. Each touches the counters of its own kind only: a month's are the
-- periods of its length (service/quota/periods.py).

-- name: job_run_claim
-- The (job, period) run row, created on first use. The CTE's insert is invisible to the second
-- SELECT (one snapshot), so exactly one of the two branches returns the row.
WITH claimed AS (
    INSERT INTO job_runs (job, period) VALUES (%(job)s, %(period)s)
    ON CONFLICT (job, period) DO NOTHING
    RETURNING status, finished_at, counters_reset, reset_rows, batches,
              cursor_period, cursor_account, cursor_metric
)
SELECT * FROM claimed
UNION ALL
SELECT status, finished_at, counters_reset, reset_rows, batches,
       cursor_period, cursor_account, cursor_metric
  FROM job_runs
 WHERE job = %(job)s AND period = %(period)s

-- name: job_run_get
SELECT status, started_at, finished_at, counters_reset, reset_rows, batches, runner
  FROM job_runs
 WHERE job = %(job)s AND period = %(period)s

-- name: job_run_progress
-- statement_timestamp(), not clock_timestamp(): job_runs is a reference table on Citus, which
-- refuses a VOLATILE function in an UPDATE of a distributed table (it evaluates a STABLE one once).
UPDATE job_runs
   SET batches = batches + 1,
       counters_reset = counters_reset + %(counters)s,
       reset_rows = reset_rows + %(reset_rows)s,
       cursor_period = %(cursor_period)s, cursor_account = %(cursor_account)s,
       cursor_metric = %(cursor_metric)s,
       runner = %(runner)s, updated_at = statement_timestamp()
 WHERE job = %(job)s AND period = %(period)s

-- name: job_run_done
UPDATE job_runs
   SET status = 'done', finished_at = statement_timestamp(), updated_at = statement_timestamp(),
       runner = %(runner)s
 WHERE job = %(job)s AND period = %(period)s
RETURNING counters_reset, reset_rows, batches, started_at, finished_at

-- name: reset_pick
-- The next counters still in an earlier period, in index order after the run's cursor: up to
-- `pick_size`, read without locks, and grouped into batches of at most `batch_size` counters of
-- one shard each (account_shard, migrations/0014: on one PostgreSQL every account is in shard 0,
-- so the groups are simply consecutive batches). Each group is then reset in its own transaction by
-- `reset_group`, which locks rows on that one shard only. Per group: its accounts, its first and
-- last counter in index order; `end_*`: the last counter picked, the run's cursor once every group
-- is reset. Reading several batches at once keeps this read off most batches' transactions.
WITH picked AS (
    SELECT period, account_id, metric
      FROM quotas
     WHERE period < %(period)s AND char_length(period) = char_length(%(period)s) AND NOT account_deleted
       AND (period, account_id, metric) > (%(cursor_period)s, %(cursor_account)s, %(cursor_metric)s)
     ORDER BY period, account_id, metric
     LIMIT %(pick_size)s
), placed AS (
    SELECT account_id, ARRAY[period::text, account_id, metric] AS key, shard,
           (row_number() OVER (PARTITION BY shard ORDER BY period, account_id, metric) - 1)
               / %(batch_size)s AS chunk
      FROM (SELECT period, account_id, metric, account_shard(account_id) AS shard FROM picked) AS p
), groups AS (
    SELECT shard, chunk, array_agg(DISTINCT account_id) AS account_ids,
           min(key) AS first_key, max(key) AS last_key
      FROM placed
     GROUP BY shard, chunk
), picked_end AS (
    SELECT max(ARRAY[period::text, account_id, metric]) AS key FROM picked
)
SELECT g.account_ids,
       g.first_key[1] AS first_period, g.first_key[2] AS first_account, g.first_key[3] AS first_metric,
       g.last_key[1] AS last_period, g.last_key[2] AS last_account, g.last_key[3] AS last_metric,
       e.key[1] AS end_period, e.key[2] AS end_account, e.key[3] AS end_metric
  FROM groups g CROSS JOIN picked_end e
 ORDER BY g.first_key

-- name: reset_group
-- Opens `period` for one group of `reset_pick` (ledger_reset_group,
-- migrations/repeatable/ledger_writers.sql): its accounts' counters from the group's first to its
-- last counter in index order that are still in an earlier period, each in its own transaction,
-- locking rows on that group's shard only.
SELECT * FROM ledger_reset_group(%(account_ids)s::text[], %(first_period)s::text, %(first_account)s::text,
                                 %(first_metric)s::text, %(last_period)s::text, %(last_account)s::text,
                                 %(last_metric)s::text, %(period)s::text, %(actor)s::text)

-- name: analyze_after_bulk_write
SELECT analyze_after_bulk_write()

-- name: reset_pending
-- Is any live counter still in an earlier period? Checked from the start of the index before a run
-- is marked done, so a counter the cursor passed over (or created behind it) is not missed.
SELECT EXISTS (SELECT 1 FROM quotas
                WHERE period < %(period)s AND char_length(period) = char_length(%(period)s)
                  AND NOT account_deleted) AS pending
