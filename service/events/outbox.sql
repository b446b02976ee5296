-- The outbox's fan-out and the retention's purge (service/events/outbox.py).

-- name: outbox_fan_out_lock
-- One relay fans out at a time: the others skip their turn rather than wait (a transaction-level
-- lock, so that a relay that dies releases it; Citus refuses FOR UPDATE across shards).
SELECT pg_try_advisory_xact_lock(%(key)s) AS got

-- name: outbox_unfanned
-- Every event not fanned out yet, whatever order they committed in: never `id > cursor`, which
-- misses a row whose transaction commits after a higher id's.
SELECT account_id, id, type, data, occurred_at
  FROM event_outbox
 WHERE NOT fanned_out
 ORDER BY id
 LIMIT %(limit)s

-- name: outbox_deliveries
-- One delivery per (event, endpoint) for each enabled endpoint subscribed to the event's type; a
-- second fan-out of the same event adds nothing.
INSERT INTO webhook_deliveries (endpoint_id, event_id, account_id, type, body, occurred_at)
SELECT e.id, v.event_id, v.account_id, v.type, v.body, v.occurred_at
  FROM unnest(%(event_ids)s::bigint[], %(account_ids)s::text[], %(types)s::text[], %(bodies)s::text[],
              %(occurred)s::timestamptz[]) AS v (event_id, account_id, type, body, occurred_at)
  JOIN webhook_endpoints e ON v.type = ANY (e.events) AND e.enabled AND e.deleted_at IS NULL
ON CONFLICT (event_id, endpoint_id) DO NOTHING

-- name: outbox_mark_fanned
-- An account's events marked fanned out: one statement per account, so that on Citus each names its
-- shard.
UPDATE event_outbox SET fanned_out = true WHERE account_id = %(account_id)s AND id = ANY (%(ids)s)

-- name: outbox_fail_orphans
-- Waiting deliveries of an endpoint disabled or deleted while they were being sent (the functions
-- that disable and delete skip those): failed, so that they finish and are purged.
UPDATE webhook_deliveries d
   SET status = 'failed', finished_at = now(), last_error = 'endpoint disabled or deleted'
 WHERE d.id IN (SELECT w.id
                  FROM webhook_deliveries w JOIN webhook_endpoints e ON e.id = w.endpoint_id
                 WHERE w.status = 'pending' AND NOT (e.enabled AND e.deleted_at IS NULL)
                   FOR UPDATE OF w SKIP LOCKED)

-- name: outbox_purge_deliveries
DELETE FROM webhook_deliveries WHERE status <> 'pending' AND finished_at < now() - %(keep)s::interval

-- name: outbox_purge_events
DELETE FROM event_outbox WHERE fanned_out AND occurred_at < now() - %(keep)s::interval
