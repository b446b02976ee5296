-- Subscriptions that end by time (service/billing/expiry.py).

-- name: subscriptions_due_accounts
-- The expiry job: accounts with a subscription whose access ended by time (billing_effective_status)
-- with no event saying so. Read without locks; each account is then handled under its lock.
SELECT DISTINCT account_id
  FROM subscriptions
 WHERE expires_at <= %(at)s AND billing_effective_status(status, expires_at, %(at)s) <> status
 LIMIT %(batch_size)s

-- name: subscriptions_end_by_time
-- Ends the account's subscriptions whose access ended by time; the caller holds the account's lock
-- (account_lock) and recomputes its tier and status.
UPDATE subscriptions
   SET status = billing_effective_status(status, expires_at, %(at)s), updated_at = now()
 WHERE account_id = %(account_id)s AND expires_at <= %(at)s
   AND billing_effective_status(status, expires_at, %(at)s) <> status
RETURNING provider, subscription_id
