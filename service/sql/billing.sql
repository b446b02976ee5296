-- Billing queries: the webhook inbox, subscription state, customer links. Parameters are named.

-- name: inbox_insert
-- Dedupe and persist in one statement: no row back means this (provider, event_id) is stored
-- already. A concurrent copy waits on the unique index until the first one commits, then gets
-- nothing back too, so ten simultaneous deliveries store and apply one event.
INSERT INTO webhook_events (provider, event_id, type, occurred_at, status, note, payload, processed_at)
VALUES (%(provider)s, %(event_id)s, %(type)s, %(occurred_at)s, %(status)s, %(note)s, %(payload)s::jsonb,
        CASE WHEN %(status)s <> 'received' THEN now() END)
ON CONFLICT (provider, event_id) DO NOTHING
RETURNING id

-- name: inbox_status
SELECT id, status FROM webhook_events WHERE provider = %(provider)s AND event_id = %(event_id)s

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

-- name: resolve_account
-- The first known account among, in this order: the ids the event names, the subscription's
-- current owner, the customer linked by the product (accounts.stripe_customer_id), the customer
-- linked by an earlier event.
WITH candidate (account_id, rank) AS (
    SELECT u.id, u.n FROM unnest(%(account_ids)s::text[]) WITH ORDINALITY AS u (id, n)
    UNION ALL
    SELECT account_id, 1000 FROM subscriptions
     WHERE provider = %(provider)s AND subscription_id = %(subscription_id)s
    UNION ALL
    SELECT id, 2000 FROM accounts
     WHERE %(provider)s = 'stripe' AND stripe_customer_id = %(customer_id)s
    UNION ALL
    SELECT account_id, 3000 FROM customer_links
     WHERE provider = %(provider)s AND customer_id = %(customer_id)s
)
SELECT a.id
  FROM candidate c JOIN accounts a ON a.id = c.account_id
 ORDER BY c.rank
 LIMIT 1

-- name: subscription_upsert
-- The ordering rule, in one statement under the subscription's row lock. An event applies if it is
-- newer than the stored one; at equal provider time (Stripe `created` has 1 s resolution) an ended
-- status wins, so every delivery order ends in the same state. A `final` subscription (Stripe
-- canceled) is never reopened, not even by a newer event. No row back: not applied.
-- `status` NULL keeps the stored status. `prior_account_id` is set from the row being replaced, so
-- RETURNING tells the caller whose subscription this was.
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
RETURNING account_id, prior_account_id, plan, status

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
-- Serialises the recomputation of an account's tier and status; always in id order. Runs after
-- this transaction's subscription writes, so the next statement sees every subscription committed
-- before the lock was granted. NO KEY UPDATE, not UPDATE: those writes hold FOR KEY SHARE on the
-- account (the foreign key), which FOR UPDATE would wait on, deadlocking two such transactions.
SELECT id, plan, subscription_status
  FROM accounts
 WHERE id = ANY(%(account_ids)s::text[])
 ORDER BY id
   FOR NO KEY UPDATE

-- name: accounts_best_subscription
-- Each account's deciding subscription: access (active, trialing) beats grace (past_due) beats
-- lapsed (paused, unpaid, incomplete) beats ended (canceled, expired); then the newest event.
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
