-- Quota limits follow the plan: how an account's plan tier turns into its counters' stored limits.
-- Quota's SQL, applied by `quota-ledger migrate` after the versioned migrations on every run
-- (service/migrate.py), like every file of this folder. Billing's SQL (billing_rules.sql) calls
-- quota_set_limits_for_plan when an account's tier or status changes; plan sync
-- (service/quota/plan_sync.sql) calls quota_sync_lock_accounts and quota_sync_limits. None ever
-- writes usage or an override column: an override is sticky and stays in effect whatever the plan
-- says.
--
-- Only functions live here; changing a signature needs a versioned migration that drops the old one.

-- "Plan limits follow the tier", for one account: bring the account's counter rows of the given
-- metrics in line with their plan limit, free limit and lapsed flag. Touches only rows whose
-- values differ (locked in metric order, as the reset batches lock them, so the two never
-- deadlock), never usage or the override columns, and writes one audit row per changed row with the
-- old and new values, a lapse-only change included. Returns the changes. Every statement names the
-- account, so on Citus it runs on the account's shard: a join with the targets would lock rows
-- across shards, which Citus refuses.
CREATE OR REPLACE FUNCTION quota_set_plan_limits(
    p_account_id text, p_metrics text[], p_plan_limits bigint[], p_free_limits bigint[],
    p_lapsed boolean[], p_actor text
) RETURNS TABLE (account_id text, metric text, old_plan_limit bigint, new_plan_limit bigint,
                 old_free_limit bigint, new_free_limit bigint, old_lapsed boolean, new_lapsed boolean,
                 override_set boolean, override_limit bigint)
-- Every function of this file is a SECURITY DEFINER function: the limits and their audit rows are
-- written by the owner (the service's role may not append to the audit log), and so, in each
-- transaction, is everything else on the account's tables (docs/design/ledger-writers.md). The
-- service's role calls plan sync's two (quota_sync_lock_accounts, quota_sync_limits); the others are
-- called by those and by billing_set_tier (billing_rules.sql), as the owner.
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
    r record;
BEGIN
    -- The rows to change, locked first (a statement of its own: Citus mishandles a locking CTE's
    -- result); the next statement's snapshot reads them as locked.
    PERFORM
      FROM quotas q
      JOIN unnest(p_metrics, p_plan_limits, p_free_limits, p_lapsed) AS t (metric, plan_limit, free_limit, lapsed)
        ON q.metric = t.metric
     WHERE q.account_id = p_account_id
       AND (q.plan_limit IS DISTINCT FROM t.plan_limit OR q.free_limit IS DISTINCT FROM t.free_limit
            OR q.lapsed <> t.lapsed)
     ORDER BY q.metric
       FOR UPDATE OF q;
    FOR r IN
    WITH target AS (
        SELECT * FROM unnest(p_metrics, p_plan_limits, p_free_limits, p_lapsed)
                      AS t (metric, plan_limit, free_limit, lapsed)
    ), old AS (
        SELECT q.metric, q.plan_limit, q.free_limit, q.lapsed, q.override_set, q.override_limit
          FROM quotas q
          JOIN target t ON q.metric = t.metric
         WHERE q.account_id = p_account_id
           AND (q.plan_limit IS DISTINCT FROM t.plan_limit OR q.free_limit IS DISTINCT FROM t.free_limit
                OR q.lapsed <> t.lapsed)
    ), changed AS (
        UPDATE quotas q
           SET plan_limit = t.plan_limit, free_limit = t.free_limit, lapsed = t.lapsed
          FROM target t, old
         WHERE q.account_id = p_account_id AND q.metric = t.metric AND old.metric = t.metric
     RETURNING q.metric, q.plan_limit, q.free_limit, q.lapsed
    )
    SELECT c.metric::text AS metric, o.plan_limit::bigint AS old_plan, c.plan_limit::bigint AS new_plan,
           o.free_limit::bigint AS old_free, c.free_limit::bigint AS new_free, o.lapsed AS old_lapsed,
           c.lapsed AS new_lapsed, o.override_set, o.override_limit::bigint AS override_limit
      FROM changed c JOIN old o ON o.metric = c.metric
     ORDER BY 1
    LOOP
        PERFORM audit_append(p_actor, 'plan_limit_changed', p_account_id, r.metric,
                             jsonb_build_object('plan_limit', r.old_plan, 'free_limit', r.old_free,
                                                'lapsed', r.old_lapsed),
                             jsonb_build_object('plan_limit', r.new_plan, 'free_limit', r.new_free,
                                                'lapsed', r.new_lapsed));
        account_id := p_account_id; metric := r.metric;
        old_plan_limit := r.old_plan; new_plan_limit := r.new_plan;
        old_free_limit := r.old_free; new_free_limit := r.new_free;
        old_lapsed := r.old_lapsed; new_lapsed := r.new_lapsed;
        override_set := r.override_set; override_limit := r.override_limit;
        RETURN NEXT;
    END LOOP;
END
$$;

-- The same rule for many (account, metric) targets (plan sync): quota_set_plan_limits for each
-- account that has a row to change, in account order (so rows are locked in (account, metric)
-- order). Returns the changes. Which accounts: one read without locks over all the targets (on
-- Citus, a distributed read, which may span shards): a daily sync mostly finds none, and a call
-- per account costs more than the read (docs/design/billing.md).
CREATE OR REPLACE FUNCTION quota_set_plan_limits_batch(
    p_account_ids text[], p_metrics text[], p_plan_limits bigint[], p_free_limits bigint[],
    p_lapsed boolean[], p_actor text
) RETURNS TABLE (account_id text, metric text, old_plan_limit bigint, new_plan_limit bigint,
                 old_free_limit bigint, new_free_limit bigint, old_lapsed boolean, new_lapsed boolean,
                 override_set boolean, override_limit bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
    v_account text;
    v_metrics text[];
    v_plan_limits bigint[];
    v_free_limits bigint[];
    v_lapsed boolean[];
BEGIN
    FOR v_account, v_metrics, v_plan_limits, v_free_limits, v_lapsed IN
        SELECT t.a, array_agg(t.m ORDER BY t.m), array_agg(t.p ORDER BY t.m),
               array_agg(t.f ORDER BY t.m), array_agg(t.l ORDER BY t.m)
          FROM unnest(p_account_ids, p_metrics, p_plan_limits, p_free_limits, p_lapsed) AS t (a, m, p, f, l)
          JOIN quotas q ON q.account_id = t.a AND q.metric = t.m
         WHERE q.plan_limit IS DISTINCT FROM t.p OR q.free_limit IS DISTINCT FROM t.f OR q.lapsed <> t.l
         GROUP BY t.a
         ORDER BY t.a
    LOOP
        RETURN QUERY
        SELECT * FROM quota_set_plan_limits(v_account, v_metrics, v_plan_limits, v_free_limits, v_lapsed,
                                            p_actor);
    END LOOP;
END
$$;

-- The same rule for one account whose tier or status changed (billing_set_tier, the one
-- path of every billing change): its targets from the plan table (PlanConfig.limit_table: every
-- plan x every metric; an unknown plan gets the free plan's limits) and the lapsed flag the caller
-- decided. Returns the number of changed rows. Called only when tier or status changed
-- (docs/design/billing.md: why that matters).
CREATE OR REPLACE FUNCTION quota_set_limits_for_plan(
    p_account_id text, p_plan text, p_lapsed boolean, p_actor text,
    p_free_plan text, p_plan_names text[], p_plan_metrics text[], p_plan_limits bigint[]
) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
    changes integer;
BEGIN
    WITH plan_limits AS (
        SELECT * FROM unnest(p_plan_names, p_plan_metrics, p_plan_limits) AS l (plan, metric, lim)
    ), target AS (
        SELECT p.metric, p.lim AS plan_limit, f.lim AS free_limit
          FROM plan_limits p JOIN plan_limits f ON f.metric = p.metric
         WHERE f.plan = p_free_plan
           AND p.plan = CASE WHEN p_plan = ANY (p_plan_names) THEN p_plan ELSE p_free_plan END
    )
    SELECT count(*) INTO changes
      FROM quota_set_plan_limits(
               p_account_id,
               ARRAY(SELECT metric FROM target ORDER BY metric),
               ARRAY(SELECT plan_limit FROM target ORDER BY metric),
               ARRAY(SELECT free_limit FROM target ORDER BY metric),
               ARRAY(SELECT p_lapsed FROM target ORDER BY metric),
               p_actor);
    RETURN changes;
END
$$;

-- Plan sync's lock of one group of accounts (service/quota/plan_sync.sql): the group's live accounts
-- with their tier, status and lapsed flag, share-locked, so that a webhook changing an account's plan
-- waits for this batch (or this batch waits for it and reads the new plan) and the sync never
-- writes a stale plan's limits. The group is one shard's.
CREATE OR REPLACE FUNCTION quota_sync_lock_accounts(p_group_ids text[], p_free_plan text)
RETURNS TABLE (id text, plan text, subscription_status text, lapsed boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $f$
#variable_conflict use_column
BEGIN
RETURN QUERY
SELECT a.id::text, a.plan, a.subscription_status::text,
       billing_is_lapsed(a.plan, a.subscription_status, p_free_plan)
  FROM accounts a
 WHERE a.id = ANY(p_group_ids) AND NOT a.deleted
 ORDER BY a.id
   FOR SHARE;
END
$f$;

-- Plan sync's change for one group (the targets: every (account, metric) of its accounts): the
-- counter rows the accounts lack, created in p_period (a metric added to the plan config;
-- `created`), then the limits brought in line (quota_set_plan_limits_batch, audited). Returns both.
CREATE OR REPLACE FUNCTION quota_sync_limits(
    p_account_ids text[], p_metrics text[], p_plan_limits bigint[], p_free_limits bigint[],
    p_lapsed boolean[], p_period text, p_actor text
) RETURNS TABLE (account_id text, metric text, created boolean, old_plan_limit bigint, new_plan_limit bigint,
                 old_free_limit bigint, new_free_limit bigint, old_lapsed boolean, new_lapsed boolean,
                 override_set boolean, override_limit bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $f$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    INSERT INTO quotas AS q (account_id, metric, plan_limit, free_limit, lapsed, period)
    SELECT t.account_id, t.metric, t.plan_limit, t.free_limit, t.lapsed, p_period
      FROM unnest(p_account_ids, p_metrics, p_plan_limits, p_free_limits, p_lapsed)
               AS t (account_id, metric, plan_limit, free_limit, lapsed)
    ON CONFLICT (account_id, metric) DO NOTHING
    RETURNING q.account_id::text, q.metric::text, true, NULL::bigint, q.plan_limit::bigint, NULL::bigint,
              q.free_limit::bigint, NULL::boolean, q.lapsed, false, NULL::bigint;
    RETURN QUERY
    SELECT b.account_id, b.metric, false, b.old_plan_limit, b.new_plan_limit, b.old_free_limit,
           b.new_free_limit, b.old_lapsed, b.new_lapsed, b.override_set, b.override_limit
      FROM quota_set_plan_limits_batch(p_account_ids, p_metrics, p_plan_limits, p_free_limits, p_lapsed,
                                       p_actor) b;
END
$f$;

-- Who may call what (set_function_grants, migrations/0020): plan sync's two functions are the
-- service's; the rest is called by them and by billing_set_tier, as the owner.
CALL set_function_grants(
    ARRAY['quota_sync_lock_accounts(text[], text)',
          'quota_sync_limits(text[], text[], bigint[], bigint[], boolean[], text, text)'],
    ARRAY['quota_set_plan_limits(text, text[], bigint[], bigint[], boolean[], text)',
          'quota_set_plan_limits_batch(text[], text[], bigint[], bigint[], boolean[], text)',
          'quota_set_limits_for_plan(text, text, boolean, text, text, text[], text[], bigint[])']);
