-- depends: 0005.domains
-- One definition of "an account's stored plan limits follow its tier", for the statements that change
-- a tier: accounts.apply_plan (service/quota/accounts.sql) and the one-statement webhook delivery
-- (subscription_delivery in service/billing/apply.sql), which each carried their own copy of it.
--
-- Brings the account's counter rows in line with the limits of `p_plan` (an unknown plan gets the
-- free plan's, as PlanConfig.limit does) and with `p_lapsed`: touches only rows whose values differ,
-- never usage or the override columns, and writes an audit row per changed limit with the old and
-- new values (read under FOR UPDATE, in metric order like the reset batches, so `old` is what this
-- call replaced and the two never deadlock). The plan table comes in as PlanConfig.limit_table's
-- arrays (every plan x every metric). Returns the number of limit changes.
--
-- Why a PL/pgSQL function rather than the same CTEs inline: a webhook delivery changes an account's
-- tier or status rarely (most events are renewals that repeat the subscription's state), and an
-- inline chain is started by the executor on every delivery whether it writes or not: the quotas
-- and audit tables and their indexes opened and locked, a dozen plan nodes built and torn down.
-- Called only when the tier or status changed, this costs nothing otherwise (measured in
-- bench/webhooks.md). PL/pgSQL keeps the statement's
-- plan for the session, like a prepared statement.
CREATE FUNCTION quotas_follow_plan(
    p_account_id text, p_plan text, p_lapsed boolean, p_actor text,
    p_free_plan text, p_plan_names text[], p_plan_metrics text[], p_plan_limits bigint[]
) RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
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
    ), old AS (
        SELECT q.metric, q.plan_limit, q.free_limit
          FROM quotas q JOIN target t ON q.metric = t.metric
         WHERE q.account_id = p_account_id
           AND (q.plan_limit IS DISTINCT FROM t.plan_limit OR q.free_limit IS DISTINCT FROM t.free_limit
                OR q.lapsed <> p_lapsed)
         ORDER BY q.metric
           FOR UPDATE OF q
    ), limits_set AS (
        UPDATE quotas q
           SET plan_limit = t.plan_limit, free_limit = t.free_limit, lapsed = p_lapsed
          FROM target t, old
         WHERE q.account_id = p_account_id AND q.metric = t.metric AND old.metric = t.metric
     RETURNING q.metric, q.plan_limit, q.free_limit
    ), audited AS (
        INSERT INTO audit_log (actor, action, account_id, metric, old, new)
        SELECT p_actor, 'plan_limit_changed', p_account_id, c.metric,
               jsonb_build_object('plan_limit', o.plan_limit, 'free_limit', o.free_limit),
               jsonb_build_object('plan_limit', c.plan_limit, 'free_limit', c.free_limit)
          FROM limits_set c JOIN old o ON o.metric = c.metric
         WHERE o.plan_limit IS DISTINCT FROM c.plan_limit OR o.free_limit IS DISTINCT FROM c.free_limit
        RETURNING 1
    )
    SELECT count(*) INTO changes FROM audited;
    RETURN changes;
END
$$;
