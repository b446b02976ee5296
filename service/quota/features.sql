-- Boolean features (service/quota/features.py). Keyed by account_id.

-- name: account_features
-- Every feature named in %(features)s for one account, in one read, with the rule that decides each:
-- the limits' precedence (quotas.lim, migrations/0001). An admin override wins; else a paid plan
-- whose subscription lapsed (billing_is_lapsed, migrations/repeatable/billing_rules.sql) has the
-- free plan's features; else the plan's (a plan the config does not know has the free plan's, as
-- for limits). The plans' features come as (plan, feature) pairs from the config. No row: no such
-- account (or no feature asked).
SELECT f.feature, a.deleted AS account_deleted, o.enabled AS override,
       CASE WHEN o.enabled IS NOT NULL THEN 'override'
            WHEN s.lapsed THEN 'free_fallback'
            ELSE 'plan' END AS source,
       coalesce(o.enabled,
                (s.plan, f.feature) IN (SELECT * FROM unnest(%(plan_names)s::text[], %(plan_features)s::text[])))
           AS enabled
  FROM accounts a
 CROSS JOIN LATERAL (
       SELECT billing_is_lapsed(a.plan, a.subscription_status, %(free_plan)s) AS lapsed,
              CASE WHEN billing_is_lapsed(a.plan, a.subscription_status, %(free_plan)s)
                     OR a.plan <> ALL(%(plans)s::text[]) THEN %(free_plan)s
                   ELSE a.plan END AS plan) AS s
 CROSS JOIN unnest(%(features)s::text[]) AS f (feature)
  LEFT JOIN account_features o ON o.account_id = a.id AND o.feature = f.feature
 WHERE a.id = %(account_id)s
 ORDER BY f.feature

-- name: feature_override_change
-- Sets (enabled true or false) or clears (NULL) a feature's override and writes its audit row, in one
-- call (feature_set_override, migrations/repeatable/features.sql). Answers the previous override
-- (NULL: none); no row: no such account.
SELECT previous
  FROM feature_set_override(%(account_id)s::text, %(feature)s::text, %(enabled)s::boolean, %(actor)s::text)
