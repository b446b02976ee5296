-- An account's billing standing as support reads it (service/billing/standing.py).

-- name: standing_subscriptions
-- The account's subscriptions, newest event first, each marked when it is the one the account
-- follows: the plan and status that billing_deciding_subscription (the rule, billing_rules.sql)
-- chooses. Two subscriptions with that same plan and status decide alike; both are marked.
SELECT s.provider, s.subscription_id, s.plan, s.status, s.final, s.event_at, s.event_id, s.expires_at,
       (s.plan, s.status::text) IS NOT DISTINCT FROM (d.plan, d.status) AS deciding
  FROM subscriptions s
  LEFT JOIN billing_deciding_subscription(%(account_id)s, NULL, NULL, NULL, NULL, NULL, false) d ON true
 WHERE s.account_id = %(account_id)s
 ORDER BY s.event_at DESC, s.provider, s.subscription_id

-- name: standing_events
-- The latest inbox rows about the account, newest first: those resolved to it (webhook_events_account,
-- migrations/0025) and those still unmatched that name it (webhook_events_waiting_names, 0008).
SELECT * FROM (
    (SELECT id, provider, event_id, type, status, error, note, account_id, subscription_id, customer_id,
            occurred_at, received_at, processed_at, attempts
       FROM webhook_events
      WHERE account_id = %(account_id)s
      ORDER BY id DESC
      LIMIT %(limit)s)
    UNION ALL
    (SELECT id, provider, event_id, type, status, error, note, account_id, subscription_id, customer_id,
            occurred_at, received_at, processed_at, attempts
       FROM webhook_events
      WHERE status = 'unmatched' AND named_accounts @> ARRAY[%(account_id)s::text]
      ORDER BY id DESC
      LIMIT %(limit)s)
) e
 ORDER BY id DESC
 LIMIT %(limit)s
