-- Billing queries: the webhook inbox, subscription state, customer links. Parameters are named.

-- name: inbox_insert
-- Dedupe and persist in one statement, for an event with nothing to apply (ignored, failed): no row
-- back means this (provider, event_id) is stored already. A concurrent copy waits on the unique
-- index until the first one commits, then gets nothing back too.
INSERT INTO webhook_events (provider, event_id, type, occurred_at, status, error, note, payload,
                            processed_at)
VALUES (%(provider)s, %(event_id)s, %(type)s, %(occurred_at)s, %(status)s, %(error)s, %(note)s,
        %(payload)s::json, now())
ON CONFLICT (provider, event_id) DO NOTHING
RETURNING id

-- name: inbox_status
SELECT id, status FROM webhook_events WHERE provider = %(provider)s AND event_id = %(event_id)s

-- name: inbox_failed
-- A replay whose apply failed (and was rolled back): record why.
UPDATE webhook_events
   SET status = 'failed', error = %(error)s, attempts = attempts + 1, processed_at = now()
 WHERE id = %(id)s

-- name: inbox_finish
UPDATE webhook_events
   SET status = %(status)s, error = %(error)s, note = %(note)s, account_id = %(account_id)s,
       subscription_id = %(subscription_id)s, customer_id = %(customer_id)s,
       attempts = attempts + %(replay)s::int, processed_at = now()
 WHERE id = %(id)s

-- name: inbox_get
SELECT id, provider, event_id, type, status, error, note, account_id, subscription_id, customer_id,
       occurred_at, received_at, processed_at, attempts
  FROM webhook_events
 WHERE id = %(id)s

-- name: inbox_for_replay
-- Locks the row: concurrent replays of one event run one after the other.
SELECT id, provider, event_id, type, occurred_at, payload
  FROM webhook_events
 WHERE id = %(id)s
   FOR UPDATE

-- name: inbox_page
SELECT id, provider, event_id, type, status, error, note, account_id, subscription_id, customer_id,
       occurred_at, received_at, processed_at, attempts
  FROM webhook_events
 WHERE id > %(after)s
   AND (%(status)s::text IS NULL OR status = %(status)s)
   AND (%(provider)s::text IS NULL OR provider = %(provider)s)
 ORDER BY id
 LIMIT %(limit)s

-- name: inbox_insert_resolved
-- The normal path's first statement: resolve the event's account and lock it (as resolve_account),
-- then dedupe and persist the event (as inbox_insert), stored as `applied` with its account, or
-- `unmatched`; the caller corrects the row in the same transaction if the outcome differs. No row
-- back: a duplicate (a concurrent copy waits on the account lock or the unique index until the
-- first commits). One round trip instead of two, on every delivery.
WITH acct AS (
    SELECT a.id, a.plan, a.subscription_status
      FROM billing_account_candidates(%(provider)s, %(account_ids)s::text[], %(subscription_id)s,
                                      %(customer_id)s) c
      JOIN accounts a ON a.id = c.account_id
     ORDER BY c.rank
     LIMIT 1
       FOR NO KEY UPDATE OF a
), ins AS (
    INSERT INTO webhook_events (provider, event_id, type, occurred_at, status, account_id,
                                subscription_id, customer_id, payload, processed_at)
    SELECT %(provider)s, %(event_id)s, %(type)s, %(occurred_at)s,
           CASE WHEN EXISTS (SELECT FROM acct) THEN 'applied' ELSE 'unmatched' END,
           (SELECT id FROM acct), %(subscription_id)s, %(customer_id)s, %(payload)s::json, now()
    ON CONFLICT (provider, event_id) DO NOTHING
    RETURNING id
)
SELECT ins.id AS inbox_id, acct.id, acct.plan, acct.subscription_status
  FROM ins LEFT JOIN acct ON true

-- name: resolve_account
-- The first known account an event may be for (see billing_account_candidates), locked until
-- commit (only the row returned): every change to an account's subscriptions holds this lock, so
-- the statements after it see every other change to them. NO KEY UPDATE, not UPDATE: it must not
-- wait on the FOR KEY SHARE locks that foreign keys to accounts take.
SELECT a.id, a.plan, a.subscription_status
  FROM billing_account_candidates(%(provider)s, %(account_ids)s::text[], %(subscription_id)s,
                                  %(customer_id)s) c
  JOIN accounts a ON a.id = c.account_id
 ORDER BY c.rank
 LIMIT 1
   FOR NO KEY UPDATE OF a

-- name: subscription_apply
-- One statement for a subscription event, under the account lock taken by resolve_account:
-- `up`: the ordering rule, under the subscription's row lock. An event applies if it is newer than
--   the stored one; at equal provider time (Stripe `created` has 1 s resolution) an ended status
--   wins, so every delivery order ends in the same state. A `final` subscription (Stripe canceled)
--   is never reopened, not even by a newer event. `status` NULL keeps the stored status.
--   `prior_account_id` takes the replaced row's owner, so RETURNING says whose it was.
-- `link`: the customer is linked to the account unless it is linked already.
-- `best`: the account's deciding subscription after this change (the CTE's own write is not
--   visible to the other parts of the statement, so `up` stands in for its stored row): access
--   (active, trialing) beats grace (past_due) beats lapsed (paused, unpaid, incomplete) beats ended
--   (canceled, expired); then the newest event.
-- No row back: the event was not applied (older, or the subscription ended for good).
WITH up AS (
    INSERT INTO subscriptions AS s (provider, subscription_id, account_id, plan, status, final, event_at,
                                    event_id)
    VALUES (%(provider)s, %(subscription_id)s, %(account_id)s, %(plan)s,
            coalesce(%(status)s, %(status_if_new)s), %(final)s, %(event_at)s, %(event_id)s)
    ON CONFLICT (provider, subscription_id) DO UPDATE
       SET prior_account_id = s.account_id,
           account_id = EXCLUDED.account_id,
           plan = coalesce(EXCLUDED.plan, s.plan),
           status = coalesce(%(status)s, s.status),
           final = EXCLUDED.final,
           event_at = EXCLUDED.event_at,
           event_id = EXCLUDED.event_id,
           updated_at = now()
     WHERE NOT (s.final AND NOT EXCLUDED.final)
       AND (s.event_at < EXCLUDED.event_at
            OR s.event_at = EXCLUDED.event_at
               AND (coalesce(%(status)s, s.status) IN ('canceled', 'expired')
                    OR s.status NOT IN ('canceled', 'expired')))
    RETURNING subscription_id, prior_account_id, plan, status, event_at
), link AS (
    INSERT INTO customer_links (provider, customer_id, account_id, event_id)
    SELECT %(provider)s, %(customer_id)s, %(account_id)s, %(event_id)s
     WHERE %(customer_id)s::text IS NOT NULL AND EXISTS (SELECT FROM up)
    ON CONFLICT (provider, customer_id) DO NOTHING
    RETURNING account_id
), best AS (
    SELECT c.plan, c.status
      FROM (SELECT subscription_id, plan, status, event_at FROM subscriptions
             WHERE account_id = %(account_id)s
               AND NOT (provider = %(provider)s AND subscription_id = %(subscription_id)s)
            UNION ALL
            SELECT subscription_id, plan, status, event_at FROM up) c
     ORDER BY CASE c.status WHEN 'active' THEN 0 WHEN 'trialing' THEN 0 WHEN 'past_due' THEN 1
                            WHEN 'canceled' THEN 3 WHEN 'expired' THEN 3 ELSE 2 END,
              c.event_at DESC, c.subscription_id
     LIMIT 1
)
SELECT up.prior_account_id, best.plan AS best_plan, best.status AS best_status,
       coalesce((SELECT account_id FROM link),
                (SELECT account_id FROM customer_links
                  WHERE provider = %(provider)s AND customer_id = %(customer_id)s)) AS customer_account_id
  FROM up, best

-- name: subscription_get
SELECT account_id, plan, status, final, event_at, event_id
  FROM subscriptions
 WHERE provider = %(provider)s AND subscription_id = %(subscription_id)s

-- name: subscriptions_transfer
-- Moves the provider's subscriptions of the source accounts to `account_id`, except those whose
-- stored event is newer than the transfer (that event already says who has them). The transfer
-- becomes their newest event, so an older event naming the source cannot move them back.
UPDATE subscriptions s
   SET prior_account_id = s.account_id, account_id = %(account_id)s,
       event_at = %(event_at)s, event_id = %(event_id)s, updated_at = now()
 WHERE s.provider = %(provider)s AND s.account_id = ANY(%(from_ids)s::text[])
   AND s.account_id <> %(account_id)s AND s.event_at <= %(event_at)s
RETURNING s.subscription_id, s.prior_account_id

-- name: accounts_lock
-- The account lock of resolve_account for several accounts (transfers, a subscription's previous
-- owner), always in id order. The next statement sees every subscription committed before it.
SELECT id, plan, subscription_status
  FROM accounts
 WHERE id = ANY(%(account_ids)s::text[])
 ORDER BY id
   FOR NO KEY UPDATE

-- name: accounts_best_subscription
-- Each account's deciding subscription, ranked as in subscription_apply.
SELECT DISTINCT ON (account_id) account_id, plan, status
  FROM subscriptions
 WHERE account_id = ANY(%(account_ids)s::text[])
 ORDER BY account_id,
          CASE status WHEN 'active' THEN 0 WHEN 'trialing' THEN 0 WHEN 'past_due' THEN 1
                      WHEN 'canceled' THEN 3 WHEN 'expired' THEN 3 ELSE 2 END,
          event_at DESC, subscription_id

-- name: customer_link
-- A customer keeps the first account it was linked to; returns the account it is linked to.
WITH new AS (
    INSERT INTO customer_links (provider, customer_id, account_id, event_id)
    VALUES (%(provider)s, %(customer_id)s, %(account_id)s, %(event_id)s)
    ON CONFLICT (provider, customer_id) DO NOTHING
    RETURNING account_id
)
SELECT account_id FROM new
UNION ALL
SELECT account_id FROM customer_links WHERE provider = %(provider)s AND customer_id = %(customer_id)s
LIMIT 1
