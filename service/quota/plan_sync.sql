-- The daily plan sync (service/quota/plan_sync.py): stored plan limits brought in line with the
-- plan config, never an override column.

-- name: plan_sync_pick
-- The next batch of live accounts after `after`, in id order, read without locks and grouped by
-- the shard that holds them (account_shard, migrations/0014; on one PostgreSQL: one group). Each
-- group is then synced in its own transaction, whose statements name its accounts, so that on Citus
-- it locks rows on that one shard only. `end_id`: the batch's last account, where the next starts.
WITH picked AS (
    SELECT id
      FROM accounts
     WHERE NOT deleted AND id > %(after)s
     ORDER BY id
     LIMIT %(batch_size)s
)
SELECT array_agg(id ORDER BY id) AS group_ids, (SELECT max(id) FROM picked) AS end_id
  FROM picked
 GROUP BY account_shard(id)
 ORDER BY min(id)

-- name: plan_sync_accounts
-- A group's live accounts, for a dry run (no locks).
SELECT id, plan, subscription_status, billing_is_lapsed(plan, subscription_status, %(free_plan)s) AS lapsed
  FROM accounts
 WHERE id = ANY(%(group_ids)s::text[]) AND NOT deleted
 ORDER BY id

-- name: plan_sync_lock_accounts
-- The same, share-locked (quota_sync_lock_accounts, migrations/repeatable/quota_limits.sql): a
-- webhook changing an account's plan waits for this batch (or this batch waits for it and reads the
-- new plan), so the sync never writes a stale plan's limits. As the owner, who then writes the
-- group's counters and audit rows.
SELECT id, plan, subscription_status, lapsed
  FROM quota_sync_lock_accounts(%(group_ids)s::text[], %(free_plan)s::text)

-- name: plan_sync_diff
-- What a sync of these targets would change, and the overrides it leaves alone. Read only. The
-- counters are read by the group's accounts (`group_ids`), one shard's, before the join.
WITH target AS (
    SELECT * FROM unnest(%(account_ids)s::text[], %(metrics)s::text[], %(plan_limits)s::bigint[],
                         %(free_limits)s::bigint[], %(lapsed)s::boolean[])
                  AS t (account_id, metric, plan_limit, free_limit, lapsed)
), counters AS (
    SELECT account_id, metric, plan_limit, free_limit, lapsed, override_set, override_limit
      FROM quotas
     WHERE account_id = ANY(%(group_ids)s::text[])
)
SELECT t.account_id, t.metric, q.account_id IS NULL AS created,
       q.plan_limit AS old_plan_limit, t.plan_limit AS new_plan_limit,
       q.free_limit AS old_free_limit, t.free_limit AS new_free_limit,
       q.lapsed AS old_lapsed, t.lapsed AS new_lapsed,
       coalesce(q.override_set, false) AS override_set, q.override_limit
  FROM target t
  LEFT JOIN counters q ON q.account_id = t.account_id AND q.metric = t.metric
 WHERE q.account_id IS NULL
    OR q.plan_limit IS DISTINCT FROM t.plan_limit OR q.free_limit IS DISTINCT FROM t.free_limit
    OR q.lapsed <> t.lapsed
 ORDER BY t.account_id, t.metric

-- name: plan_sync_apply
-- "Plan limits follow the tier" for a group of accounts, all on one shard: the counter rows they lack
-- (a metric added to the plan config) created in `period`, then quota_set_plan_limits_batch, the one
-- definition that billing changes reach through quota_set_limits_for_plan, with an audit row per
-- change; in one call (quota_sync_limits, migrations/repeatable/quota_limits.sql). Kept set-based
-- rather than a call per account: a sync touches every account in batches.
SELECT account_id, metric, created, old_plan_limit, new_plan_limit, old_free_limit, new_free_limit,
       old_lapsed, new_lapsed, override_set, override_limit
  FROM quota_sync_limits(%(account_ids)s::text[], %(metrics)s::text[], %(plan_limits)s::bigint[],
                         %(free_limits)s::bigint[], %(lapsed)s::boolean[], %(period)s::text, %(actor)s::text)
