-- The webhook inbox (service/billing/inbox.py): every verified event kept, with its status.

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
       named_accounts = CASE WHEN %(status)s::inbox_status = 'unmatched'
                             THEN coalesce(%(named_accounts)s::text[], named_accounts) END,
       attempts = attempts + %(replay)s::int, processed_at = now()
 WHERE id = %(id)s

-- name: inbox_get
SELECT id, provider, event_id, type, status, error, note, account_id, subscription_id, customer_id,
       occurred_at, received_at, processed_at, attempts
  FROM webhook_events
 WHERE id = %(id)s

-- name: inbox_for_replay
-- Locks the row: concurrent replays of one event run one after the other.
SELECT id, provider, event_id, type, occurred_at, received_at, payload
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
-- A customer link's or transfer's row, once its account is resolved and locked
-- (apply.resolve_account; NULL: none): dedupe and persist it (as inbox_insert), stored as `applied`
-- with its account, or `unmatched` with the ids it names; the caller corrects the row in the same
-- transaction if the outcome differs. No row back: a duplicate (a concurrent copy waits on the
-- account lock or the unique index until the first commits).
INSERT INTO webhook_events (provider, event_id, type, occurred_at, status, account_id, subscription_id,
                            customer_id, named_accounts, payload, processed_at)
VALUES (%(provider)s, %(event_id)s, %(type)s, %(occurred_at)s,
        CASE WHEN %(account_id)s::text IS NULL THEN 'unmatched' ELSE 'applied' END, %(account_id)s,
        %(subscription_id)s, %(customer_id)s,
        CASE WHEN %(account_id)s::text IS NULL THEN %(account_ids)s::text[] END, %(payload)s::json, now())
ON CONFLICT (provider, event_id) DO NOTHING
RETURNING id

-- name: inbox_waiting
-- Stored `unmatched` events that a new link may make applicable, in provider order: those of the
-- subscription, of the customer, or naming one of the accounts (or RevenueCat aliases).
SELECT id
  FROM webhook_events
 WHERE status = 'unmatched'
   AND (%(provider)s::text IS NULL OR provider = %(provider)s)
   AND (subscription_id = %(subscription_id)s OR customer_id = %(customer_id)s
        OR named_accounts && %(account_ids)s::text[])
 ORDER BY occurred_at, id
 LIMIT 1000
