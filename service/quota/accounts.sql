-- Accounts and their counter rows (service/quota/accounts.py). Keyed by account_id.

-- name: account_upsert
-- xmax = 0 only on a freshly inserted row: tells "created" from "existed" in one statement.
INSERT INTO accounts (id, kind, plan, stripe_customer_id)
VALUES (%(account_id)s, %(kind)s, %(plan)s, %(stripe_customer_id)s)
ON CONFLICT (id) DO UPDATE
   SET kind = EXCLUDED.kind,
       stripe_customer_id = coalesce(EXCLUDED.stripe_customer_id, accounts.stripe_customer_id),
       updated_at = EXCLUDED.updated_at  -- its default, now(): Citus takes no now() in DO UPDATE
 WHERE NOT accounts.deleted
RETURNING (xmax = 0) AS created

-- name: account_customer_for_update
-- The Stripe customer the account names now, read under the account's row lock, before an upsert
-- that names one: the upsert's transaction then moves the customer's claim (stripe_customers).
SELECT stripe_customer_id FROM accounts WHERE id = %(account_id)s FOR NO KEY UPDATE

-- name: stripe_customer_claim
-- Claims a Stripe customer for the account (migrations/0013): a row back when the customer is now
-- the account's (new, or the account's already); none when another account has it. A concurrent
-- claim of the same customer waits on the key until the first commits, then sees its row.
INSERT INTO stripe_customers AS c (customer_id, account_id)
VALUES (%(customer_id)s, %(account_id)s)
ON CONFLICT (customer_id) DO UPDATE SET account_id = EXCLUDED.account_id
 WHERE c.account_id = EXCLUDED.account_id
RETURNING account_id

-- name: stripe_customer_release
-- The account's claim of the customer it no longer names.
DELETE FROM stripe_customers WHERE customer_id = %(customer_id)s AND account_id = %(account_id)s

-- name: ensure_quotas
-- Creates the counter rows an account lacks (new account, or a metric added to the plan config),
-- with the limits of its plan, each in its metric's current period. Existing rows are left alone.
INSERT INTO quotas (account_id, metric, plan_limit, free_limit, lapsed, account_deleted, period)
SELECT a.id, m.metric, m.plan_limit, m.free_limit,
       billing_is_lapsed(a.plan, a.subscription_status, %(free_plan)s), a.deleted, m.period
  FROM accounts a,
       unnest(%(metrics)s::text[], %(plan_limits)s::bigint[], %(free_limits)s::bigint[], %(periods)s::text[])
           AS m (metric, plan_limit, free_limit, period)
 WHERE a.id = %(account_id)s
ON CONFLICT (account_id, metric) DO NOTHING

-- name: account_get
SELECT id, kind, plan, subscription_status, stripe_customer_id, deleted
  FROM accounts
 WHERE id = %(account_id)s

-- name: account_quotas
-- Each metric with its current period, kind and reset (from the plan config). A counter still in an
-- earlier period reads as 0: the new period has started for it.
SELECT q.metric, m.kind, m.reset, q.lim AS "limit", q.limit_source,
       CASE WHEN q.period < m.period THEN 0 ELSE q.used END AS used,
       greatest(q.period, m.period) AS counter_period,
       q.plan_limit, q.override_set, q.override_limit,
       coalesce(c.credits, 0)::bigint AS credits  -- the live grants' remaining (README "Credits")
  FROM quotas q
  JOIN unnest(%(metrics)s::text[], %(periods)s::text[], %(kinds)s::text[], %(resets)s::text[])
           AS m (metric, period, kind, reset) ON m.metric = q.metric
  LEFT JOIN (SELECT lg.metric, sum(lg.remaining) AS credits FROM live_grants lg
              WHERE lg.account_id = %(account_id)s GROUP BY lg.metric) AS c ON c.metric = q.metric
 WHERE q.account_id = %(account_id)s
 ORDER BY q.metric

-- name: account_search
-- The console's account search, in id order after a cursor: an id prefix, a Stripe customer (the
-- product's link, or one learned from events), a plan; each NULL when not asked for.
SELECT id, kind, plan, subscription_status, stripe_customer_id, deleted
  FROM accounts a
 WHERE id > %(after)s
   AND (%(prefix)s::text IS NULL OR (id >= %(prefix)s AND starts_with(id, %(prefix)s)))
   AND (%(customer_id)s::text IS NULL OR stripe_customer_id = %(customer_id)s
        OR id IN (SELECT account_id FROM customer_links
                   WHERE provider = 'stripe' AND customer_id = %(customer_id)s))
   AND (%(plan)s::text IS NULL OR plan = %(plan)s)
 ORDER BY id
 LIMIT %(limit)s
