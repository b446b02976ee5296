-- Worker jobs: the monthly reset and the plan sync. Parameters are named (%(x)s).

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

-- name: plan_sync_accounts
-- The next batch of live accounts, in id order, for a dry run (no locks).
SELECT id, plan, subscription_status, billing_is_lapsed(plan, subscription_status, %(free_plan)s) AS lapsed
  FROM accounts
 WHERE NOT deleted AND id > %(after)s
 ORDER BY id
 LIMIT %(batch_size)s

-- name: plan_sync_lock_accounts
-- The same batch, share-locked: a webhook changing an account's plan waits for this batch (or this
-- batch waits for it and reads the new plan), so the sync never writes a stale plan's limits.
SELECT id, plan, subscription_status, billing_is_lapsed(plan, subscription_status, %(free_plan)s) AS lapsed
  FROM accounts
 WHERE NOT deleted AND id > %(after)s
 ORDER BY id
 LIMIT %(batch_size)s
   FOR SHARE

-- name: plan_sync_diff
-- What a sync of these targets would change, and the overrides it leaves alone. Read only.
WITH target AS (
    SELECT * FROM unnest(%(account_ids)s::text[], %(metrics)s::text[], %(plan_limits)s::bigint[],
                         %(free_limits)s::bigint[], %(lapsed)s::boolean[])
                  AS t (account_id, metric, plan_limit, free_limit, lapsed)
)
SELECT t.account_id, t.metric, q.account_id IS NULL AS created,
       q.plan_limit AS old_plan_limit, t.plan_limit AS new_plan_limit,
       q.free_limit AS old_free_limit, t.free_limit AS new_free_limit,
       q.lapsed AS old_lapsed, t.lapsed AS new_lapsed,
       coalesce(q.override_set, false) AS override_set, q.override_limit
  FROM target t
  LEFT JOIN quotas q ON q.account_id = t.account_id AND q.metric = t.metric
 WHERE q.account_id IS NULL
    OR q.plan_limit IS DISTINCT FROM t.plan_limit OR q.free_limit IS DISTINCT FROM t.free_limit
    OR q.lapsed <> t.lapsed
 ORDER BY t.account_id, t.metric

-- name: plan_sync_create
-- Counter rows for metrics an account lacks (a metric added to the plan config), in `period`.
INSERT INTO quotas (account_id, metric, plan_limit, free_limit, lapsed, period)
SELECT t.account_id, t.metric, t.plan_limit, t.free_limit, t.lapsed, %(period)s
  FROM unnest(%(account_ids)s::text[], %(metrics)s::text[], %(plan_limits)s::bigint[],
              %(free_limits)s::bigint[], %(lapsed)s::boolean[])
           AS t (account_id, metric, plan_limit, free_limit, lapsed)
ON CONFLICT (account_id, metric) DO NOTHING
RETURNING account_id, metric, plan_limit, free_limit, lapsed

-- name: plan_sync_apply
-- "Plan limits follow the tier" for a batch of accounts: quotas_follow_targets
-- (migrations/repeatable/billing_rules.sql), the one definition that apply_plan and webhook
-- deliveries reach through quotas_follow_plan. Kept set-based rather than a call per account: a
-- sync touches every account in batches.
SELECT account_id, metric, false AS created, old_plan_limit, new_plan_limit, old_free_limit,
       new_free_limit, old_lapsed, new_lapsed, override_set, override_limit
  FROM quotas_follow_targets(%(account_ids)s::text[], %(metrics)s::text[], %(plan_limits)s::bigint[],
                             %(free_limits)s::bigint[], %(lapsed)s::boolean[], %(actor)s)
