-- The webhook inbox (service/billing/inbox.py): every verified event kept, with its status, for as
-- long as its retention says.

-- name: inbox_insert
-- Dedupe and persist in one statement: no row back means this (provider, event_id) is stored already.
-- With its final status for an event with nothing to apply (ignored, failed); the locked path's
-- status is provisional, and finished in the same transaction. A concurrent copy waits on the unique
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

-- name: inbox_audit_replay
-- The replay's audit row, its facts read from the inbox row (audit_event_replayed,
-- migrations/repeatable/billing_rules.sql): the service's role appends no audit row itself.
SELECT audit_event_replayed(%(id)s::bigint, %(actor)s::text)

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

-- name: inbox_over_bound
-- Retention: a provider's oldest unmatched events beyond its newest `keep`, at most `batch` of them,
-- removed (docs/design/billing.md "Inbox retention"); the caller counts and logs them.
DELETE FROM webhook_events w
 USING (SELECT id FROM webhook_events
         WHERE status = 'unmatched' AND provider = %(provider)s
         ORDER BY id DESC
        OFFSET %(keep)s LIMIT %(batch)s) o
 WHERE w.id = o.id
RETURNING w.provider, w.status, w.event_id

-- name: inbox_purge
-- Retention: ignored events received before `ignored_before`, and applied ones before
-- `applied_before` (NULL: kept for ever, and not looked at), at most `batch` of each, oldest first,
-- removed. Ignored rows are found by the webhook_events_ignored index, not by walking what is kept.
DELETE FROM webhook_events w
 USING ((SELECT id FROM webhook_events
          WHERE status = 'ignored' AND received_at < %(ignored_before)s
          ORDER BY id
          LIMIT %(batch)s)
        UNION ALL
        (SELECT id FROM webhook_events
          WHERE %(applied_before)s::timestamptz IS NOT NULL
            AND status = 'applied' AND received_at < %(applied_before)s
          ORDER BY id
          LIMIT %(batch)s)) o
 WHERE w.id = o.id
RETURNING w.provider, w.status, w.event_id

-- name: inbox_count_purged
-- What retention removed, added to its counter (migrations/0018): nothing leaves without a trace.
INSERT INTO webhook_events_purged AS p (provider, status, reason, events, last_event_id)
VALUES (%(provider)s, %(status)s, %(reason)s, %(events)s, %(last_event_id)s)
ON CONFLICT (provider, status, reason) DO UPDATE
   SET events = p.events + EXCLUDED.events, last_event_id = EXCLUDED.last_event_id,
       last_at = EXCLUDED.last_at  -- its default, now(): Citus takes no now() in DO UPDATE

-- name: inbox_stats
-- What the inbox keeps, per provider and status (a scan: an operator's command).
SELECT provider::text, status::text, count(*) AS events, min(received_at) AS oldest,
       max(received_at) AS newest, sum(pg_column_size(payload))::bigint AS payload_bytes
  FROM webhook_events
 GROUP BY provider, status
 ORDER BY provider, status

-- name: inbox_purged_counts
-- What retention has removed so far, per provider, status and reason.
SELECT provider::text, status::text, reason, events, last_event_id, last_at
  FROM webhook_events_purged
 ORDER BY provider, status, reason

-- name: inbox_payload
-- The stored body as received, byte for byte (json keeps the text).
SELECT payload::text AS payload FROM webhook_events WHERE id = %(id)s
