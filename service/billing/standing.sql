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
-- The latest inbox rows resolved to the account or naming one of its subscriptions, newest first.
-- The inbox has no index by account (every delivery writes it): this reads the primary key from its
-- end and stops at `limit`, quick while the account's events are recent.
SELECT id, provider, event_id, type, status, error, note, account_id, subscription_id, customer_id,
       occurred_at, received_at, processed_at, attempts
  FROM webhook_events
 WHERE account_id = %(account_id)s
    OR (provider, subscription_id) IN (SELECT provider, subscription_id FROM subscriptions
                                        WHERE account_id = %(account_id)s)
 ORDER BY id DESC
 LIMIT %(limit)s
