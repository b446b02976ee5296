-- The monthly reset (service/quota/reset.py): job runs once per period, batches of counters.

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
UPDATE job_runs
   SET batches = batches + 1,
       counters_reset = counters_reset + %(counters)s,
       reset_rows = reset_rows + %(reset_rows)s,
       cursor_period = %(cursor_period)s, cursor_account = %(cursor_account)s,
       cursor_metric = %(cursor_metric)s,
       runner = %(runner)s, updated_at = clock_timestamp()
 WHERE job = %(job)s AND period = %(period)s

-- name: job_run_done
UPDATE job_runs
   SET status = 'done', finished_at = clock_timestamp(), updated_at = clock_timestamp(),
       runner = %(runner)s
 WHERE job = %(job)s AND period = %(period)s
RETURNING counters_reset, reset_rows, batches, started_at, finished_at

-- name: reset_batch
-- Opens `period` for the next batch of counters still in an earlier one, in index order after the
-- cursor: the same statement as the lazy `roll_over`, over many rows. FOR UPDATE reads each row's
-- latest version; a counter that a take rolled over meanwhile no longer matches `period < P` on the
-- re-check and drops out, so usage taken in the new period is never zeroed and no counter is opened
-- twice (the unique period-open index would refuse it anyway). A counter that held nothing gets
-- its period advanced without a ledger row. Soft-deleted accounts are left alone.
WITH batch AS (
    SELECT account_id, metric, period, used
      FROM quotas
     WHERE period < %(period)s AND NOT account_deleted
       AND (period, account_id, metric) > (%(cursor_period)s, %(cursor_account)s, %(cursor_metric)s)
     ORDER BY period, account_id, metric
     LIMIT %(batch_size)s
       FOR UPDATE
), opened AS (
    UPDATE quotas q
       SET used = 0, period = %(period)s,
           (chain_prev, chain_id, chain_at, chain_hash) = (
               SELECT q.chain_hash, e.id, e.at,
                      ledger_hash(q.chain_hash, e.id, e.at, q.account_id, q.metric, %(period)s, 'reset',
                                  batch.used, 0, NULL, NULL, 'period-open:' || %(period)s, %(actor)s)
                 FROM (SELECT nextval('ledger_id_seq') AS id, clock_timestamp() AS at) AS e)
      FROM batch
     WHERE q.account_id = batch.account_id AND q.metric = batch.metric AND batch.used > 0
 RETURNING q.account_id, q.metric, batch.used AS cleared, q.chain_id, q.chain_at, q.chain_prev, q.chain_hash
), emptied AS (  -- held nothing: the period moves on, no ledger row, the chain stays where it is
    UPDATE quotas q
       SET period = %(period)s
      FROM batch
     WHERE q.account_id = batch.account_id AND q.metric = batch.metric AND batch.used = 0
 RETURNING 1
), entries AS (
    INSERT INTO ledger (id, at, account_id, metric, period, kind, units, used_after, idempotency_key, actor,
                        prev_hash, hash)
    OVERRIDING SYSTEM VALUE
    SELECT chain_id, chain_at, account_id, metric, %(period)s, 'reset', cleared, 0,
           'period-open:' || %(period)s, %(actor)s, chain_prev, chain_hash
      FROM opened
 RETURNING 1
)
SELECT (SELECT count(*) FROM opened) + (SELECT count(*) FROM emptied) AS counters,
       (SELECT count(*) FROM entries) AS reset_rows,
       last.period AS cursor_period, last.account_id AS cursor_account, last.metric AS cursor_metric
  FROM (SELECT 1) AS one
  LEFT JOIN LATERAL (
        SELECT period, account_id, metric FROM batch
         ORDER BY period DESC, account_id DESC, metric DESC
         LIMIT 1) AS last ON true

-- name: analyze_after_bulk_write
SELECT analyze_after_bulk_write()

-- name: reset_pending
-- Is any live counter still in an earlier period? Checked from the start of the index before a run
-- is marked done, so a counter the cursor passed over (or created behind it) is not missed.
SELECT EXISTS (SELECT 1 FROM quotas WHERE period < %(period)s AND NOT account_deleted) AS pending
