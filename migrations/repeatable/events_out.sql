-- Events out, produced (migrations/0027, docs/events.md): the writers that put an event in
-- event_outbox, each called by the definer function that makes the change the event tells of, in its
-- transaction. The owner's alone: the service's role cannot write an event.

-- Whether `used` reaches p_pct percent of `lim` (used * 100 >= p_pct * lim, so 100 is reached at
-- used == lim), for a positive limit, in integers that cannot overflow whatever the limit (an
-- override may be near 2^63): lim = 100a + b, and p_pct * lim / 100 rounded up is p_pct * a +
-- ceil(p_pct * b / 100). NULL (no alert line, an unlimited counter) is not reached. Inlined by the
-- planner into the take's statement (a one-expression SQL function).
CREATE OR REPLACE FUNCTION threshold_reached(p_used bigint, p_lim bigint, p_pct integer) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_lim > 0 AND p_used >= (p_lim / 100) * p_pct + (p_lim % 100 * p_pct + 99) / 100
$$;

-- A time as events write it: ISO 8601 in UTC with microseconds and a Z, whatever the session's zone.
CREATE OR REPLACE FUNCTION event_time(p_at timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT to_char(p_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
$$;

-- One event of the account: its row, with `occurred_at` in its data (receivers drop stale ones by it).
CREATE OR REPLACE FUNCTION event_emit(p_account_id text, p_type text, p_data jsonb)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $f$
DECLARE
    v_at timestamptz := clock_timestamp();
BEGIN
    INSERT INTO event_outbox (account_id, type, data, occurred_at)
    VALUES (p_account_id, p_type, p_data || jsonb_build_object('occurred_at', event_time(v_at)), v_at);
END
$f$;

-- A take moved a counter to or past its alert line (quotas.alert_pct, migrations/0027): called by
-- the take's writer, in its transaction, holding the counter's row lock, after the take. Fires each
-- threshold of the account's plan (plan_thresholds) above the highest fired in this period
-- (`alerted`) that `used` now reaches (`used * 100 >= threshold * lim`: 100 fires when used ==
-- limit), one `quota.threshold_crossed` each, and moves the alert line to the next threshold (NULL:
-- none left, or the plan has none). `alerted` only grows within a period (a release does not lower
-- it, so a threshold fires once per period however takes and releases interleave); the period's
-- opening sets it back to 0 (ledger_roll_over, ledger_reset_group). Unlimited and zero limits fire
-- nothing. A plan with no row in plan_thresholds (not synced yet) leaves the line where it is. Every statement names the account, so on Citus it stays on the take's shard.
CREATE OR REPLACE FUNCTION quota_alert(p_account_id text, p_metric text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $f$
DECLARE
    c record;
    v_thresholds smallint[];
    v_fired smallint[];
    v_top smallint;
    t smallint;
BEGIN
    SELECT q.used, q.lim, q.alerted, q.period INTO c
      FROM quotas q WHERE q.account_id = p_account_id AND q.metric = p_metric;
    IF NOT FOUND OR c.lim IS NULL OR c.lim = 0 THEN
        RETURN;
    END IF;
    SELECT p.thresholds INTO v_thresholds
      FROM accounts a JOIN plan_thresholds p ON p.plan = a.plan
     WHERE a.id = p_account_id;
    IF NOT FOUND THEN
        RETURN;  -- the plan's thresholds are not synced yet: the line stays, the next take looks again
    END IF;
    v_fired := ARRAY(SELECT x FROM unnest(v_thresholds) AS x
                      WHERE x > c.alerted AND threshold_reached(c.used, c.lim, x) ORDER BY x);
    v_top := greatest(c.alerted, (SELECT max(x) FROM unnest(v_fired) AS x));
    UPDATE quotas q
       SET alerted = v_top, alert_pct = (SELECT min(x) FROM unnest(v_thresholds) AS x WHERE x > v_top)
     WHERE q.account_id = p_account_id AND q.metric = p_metric;
    FOREACH t IN ARRAY v_fired LOOP
        PERFORM event_emit(p_account_id, 'quota.threshold_crossed', jsonb_build_object(
            'account_id', p_account_id, 'metric', p_metric, 'period', c.period, 'threshold', t,
            'used', c.used, 'limit', c.lim));
    END LOOP;
END
$f$;

-- The alert lines a take (of one or several lines) reached on the account's counters of p_metrics:
-- quota_alert for each, in metric order. For the writers whose take is not one UPDATE ... RETURNING
-- the line itself (a multi-line take, a take with credits); ledger_take tests its own row.
CREATE OR REPLACE FUNCTION quota_alerts(p_account_id text, p_metrics text[])
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $f$
DECLARE
    m text;
BEGIN
    FOR m IN SELECT q.metric FROM quotas q
              WHERE q.account_id = p_account_id AND q.metric = ANY(p_metrics)
                AND threshold_reached(q.used, q.lim, q.alert_pct)
              ORDER BY q.metric COLLATE "C"
    LOOP
        PERFORM quota_alert(p_account_id, m);
    END LOOP;
END
$f$;

-- Why an account's tier or status changed, from the actor that changed it (service/billing: a
-- provider's delivery `webhook:<provider>:<event>`, its replay `replay:<admin>:<provider>:<event>`,
-- the expiry job `system:expire_access`); anything else is an admin's doing.
CREATE OR REPLACE FUNCTION plan_change_cause(p_actor text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN p_actor ~ '^(webhook|replay:.*):stripe:' THEN 'stripe'
        WHEN p_actor ~ '^(webhook|replay:.*):revenuecat:' THEN 'revenuecat'
        WHEN p_actor = 'system:expire_access' THEN 'expiry'
        ELSE 'admin' END
$$;

CALL set_function_grants(
    ARRAY[]::text[],
    ARRAY['event_emit(text, text, jsonb)',
          'quota_alert(text, text)',
          'quota_alerts(text, text[])']);
