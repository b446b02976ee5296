-- The billing rules, each defined once. `quota-ledger migrate` applies this file after the versioned
-- migrations on every run (CREATE OR REPLACE: idempotent), so a rule changes here and nowhere else:
-- the one-statement delivery, the locked path and replays, plan sync, apply_plan and the expiry job
-- all call these functions; Python only parses the plan config and turns notes into text.
--
-- Only functions live here, never tables or data: a function's signature is its contract, so changing
-- one (its arguments or result type) needs a versioned migration that drops the old one first.
-- Plain SQL functions that are one expression are inlined by the planner into the statements that
-- call them, so the hot path pays nothing for the indirection.

-- The lapse rule, part 1: the subscription statuses that keep a paid plan's limits.
CREATE OR REPLACE FUNCTION billing_keeps_access(status text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT status IN ('active', 'trialing', 'past_due')
$$;

-- Statuses that end a subscription.
CREATE OR REPLACE FUNCTION billing_subscription_ended(status text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT status IN ('canceled', 'expired')
$$;

-- The lapse rule, part 2: a paid plan whose status keeps no access falls back to the free plan's
-- limits (the tier itself stays as the provider last said).
CREATE OR REPLACE FUNCTION billing_is_lapsed(plan text, status text, free_plan text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT plan <> free_plan AND NOT billing_keeps_access(status)
$$;

-- The access ranking, for choosing an account's deciding subscription (lower wins): access
-- (active, trialing) beats grace (past_due) beats lapsed (paused, unpaid, incomplete) beats ended.
CREATE OR REPLACE FUNCTION subscription_access_rank(status text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN status = 'past_due' THEN 1
                WHEN billing_keeps_access(status) THEN 0
                WHEN billing_subscription_ended(status) THEN 3
                ELSE 2 END
$$;

-- A subscription's lifecycle, for breaking ties between events of the same provider second (Stripe's
-- `created` has 1 s resolution and Stripe does not order deliveries): the later stage wins, so every
-- delivery order ends in the same state. incomplete, then trialing, active, past_due, unpaid,
-- paused, then the ended ones. Every status has its own rank: a tie between two different statuses
-- always has one answer.
CREATE OR REPLACE FUNCTION subscription_lifecycle_rank(status text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE status WHEN 'incomplete' THEN 0 WHEN 'trialing' THEN 1 WHEN 'active' THEN 2
                       WHEN 'past_due' THEN 3 WHEN 'unpaid' THEN 4 WHEN 'paused' THEN 5
                       WHEN 'canceled' THEN 6 WHEN 'expired' THEN 7 ELSE -1 END
$$;

-- The best-subscription choice: the subscription that decides an account's tier and status, the
-- best subscription_access_rank, then the newest event, then the id. `p_*` stands in for one
-- subscription as a statement is about to store it (its own write is not visible to the statement
-- that makes it), in place of the stored row of that id; p_subscription_id NULL: the stored rows
-- alone. p_without_temporary leaves out the account's temporary grants of p_provider (a real
-- purchase's event supersedes them). A set-returning SQL function of one SELECT: inlined.
CREATE OR REPLACE FUNCTION billing_deciding_subscription(
    p_account_id text, p_provider text, p_subscription_id text, p_plan text, p_status text,
    p_event_at timestamptz, p_without_temporary boolean
) RETURNS TABLE (plan text, status text) LANGUAGE sql STABLE AS $$
    SELECT c.plan, c.status
      FROM (SELECT s.subscription_id, s.plan, s.status::text AS status, s.event_at
              FROM subscriptions s
             WHERE s.account_id = p_account_id
               AND NOT coalesce(s.provider = p_provider AND s.subscription_id = p_subscription_id, false)
               AND NOT coalesce(p_without_temporary AND s.provider = p_provider
                                AND s.subscription_id LIKE 'temporary:%', false)
            UNION ALL
            SELECT p_subscription_id, p_plan, p_status, p_event_at
             WHERE p_subscription_id IS NOT NULL) c
     ORDER BY subscription_access_rank(c.status), c.event_at DESC, c.subscription_id
     LIMIT 1
$$;

-- The ordering rule: does an event (new_*) replace a subscription's stored state (stored_*)?
-- A final subscription (Stripe canceled) is never reopened. A newer provider time wins. At equal
-- time: an event that opens the subscription (Stripe `customer.subscription.created`) never
-- overrides a stored state, since whatever is stored came after the creation; otherwise the later
-- lifecycle stage wins, and at the same stage the greater event id (arbitrary, but the same answer
-- in every delivery order; the same event again re-applies, which changes nothing).
CREATE OR REPLACE FUNCTION billing_event_wins(
    stored_final boolean, stored_at timestamptz, stored_status text, stored_event_id text,
    new_final boolean, new_at timestamptz, new_status text, new_event_id text, new_opens boolean
) RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT NOT (stored_final AND NOT new_final)
       AND (stored_at < new_at
            OR stored_at = new_at AND NOT new_opens
               AND (subscription_lifecycle_rank(new_status), new_event_id)
                   >= (subscription_lifecycle_rank(stored_status), stored_event_id))
$$;

-- Access that ends by time: a status that keeps access, with an end (expires_at) that has passed,
-- is `expired`. Used when an event is applied (a purchase that expired already grants nothing; a
-- refund whose period is over ends access at once) and by the expiry job for the ends that pass
-- without an event.
CREATE OR REPLACE FUNCTION billing_effective_status(status text, expires_at timestamptz, at timestamptz)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN billing_keeps_access(status) AND expires_at <= at THEN 'expired' ELSE status END
$$;

-- "Plan limits follow the tier", for one account: bring the account's counter rows of the given
-- metrics in line with their plan limit, free limit and lapsed flag. Touches only rows whose
-- values differ (locked in metric order, as the reset batches lock them, so the two never
-- deadlock), never usage or the override columns, and writes one audit row per changed row with the
-- old and new values, a lapse-only change included. Returns the changes. Every statement names the
-- account, so on Citus it runs on the account's shard: a join with the targets would lock rows
-- across shards, which Citus refuses.
CREATE OR REPLACE FUNCTION quotas_follow_account(
    p_account_id text, p_metrics text[], p_plan_limits bigint[], p_free_limits bigint[],
    p_lapsed boolean[], p_actor text
) RETURNS TABLE (account_id text, metric text, old_plan_limit bigint, new_plan_limit bigint,
                 old_free_limit bigint, new_free_limit bigint, old_lapsed boolean, new_lapsed boolean,
                 override_set boolean, override_limit bigint)
LANGUAGE plpgsql VOLATILE AS $$
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
    RETURN QUERY
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
    ), audited AS (
        INSERT INTO audit_log (actor, action, account_id, metric, old, new)
        SELECT p_actor, 'plan_limit_changed', p_account_id, c.metric,
               jsonb_build_object('plan_limit', o.plan_limit, 'free_limit', o.free_limit,
                                  'lapsed', o.lapsed),
               jsonb_build_object('plan_limit', c.plan_limit, 'free_limit', c.free_limit,
                                  'lapsed', c.lapsed)
          FROM changed c JOIN old o ON o.metric = c.metric
     RETURNING 1
    )
    SELECT p_account_id, c.metric::text, o.plan_limit::bigint, c.plan_limit::bigint,
           o.free_limit::bigint, c.free_limit::bigint, o.lapsed, c.lapsed,
           o.override_set, o.override_limit::bigint
      FROM changed c JOIN old o ON o.metric = c.metric
     ORDER BY 2;
END
$$;

-- The same rule for many (account, metric) targets (plan sync): quotas_follow_account for each
-- account that has a row to change, in account order (so rows are locked in (account, metric)
-- order, as before). Returns the changes. Which accounts: one read without locks over all the
-- targets (on Citus, a distributed read, which may span shards): a daily sync mostly finds none,
-- and a call per account costs several times what one set-based statement did.
CREATE OR REPLACE FUNCTION quotas_follow_targets(
    p_account_ids text[], p_metrics text[], p_plan_limits bigint[], p_free_limits bigint[],
    p_lapsed boolean[], p_actor text
) RETURNS TABLE (account_id text, metric text, old_plan_limit bigint, new_plan_limit bigint,
                 old_free_limit bigint, new_free_limit bigint, old_lapsed boolean, new_lapsed boolean,
                 override_set boolean, override_limit bigint)
LANGUAGE plpgsql VOLATILE AS $$
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
        SELECT * FROM quotas_follow_account(v_account, v_metrics, v_plan_limits, v_free_limits, v_lapsed,
                                            p_actor);
    END LOOP;
END
$$;

-- The same rule for one account whose tier or status changed (apply_plan, the one-statement
-- delivery): its targets from the plan table (PlanConfig.limit_table: every plan x every metric;
-- an unknown plan gets the free plan's limits) and the lapse rule. Returns the number of changed
-- rows. Called only when tier or status changed (see migrations/0006 for why that matters).
CREATE OR REPLACE FUNCTION quotas_follow_plan(
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
    )
    SELECT count(*) INTO changes
      FROM quotas_follow_account(
               p_account_id,
               ARRAY(SELECT metric FROM target ORDER BY metric),
               ARRAY(SELECT plan_limit FROM target ORDER BY metric),
               ARRAY(SELECT free_limit FROM target ORDER BY metric),
               ARRAY(SELECT p_lapsed FROM target ORDER BY metric),
               p_actor);
    RETURN changes;
END
$$;
