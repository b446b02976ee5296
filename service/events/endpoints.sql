-- Webhook endpoints and their deliveries, as the admin API sees them (service/events/endpoints.py).
-- Endpoints are written only by the definer functions of migrations/repeatable/webhooks_out.sql.

-- name: endpoint_create
SELECT webhook_endpoint_create(%(id)s, %(url)s, %(events)s, %(secret)s, %(actor)s)

-- name: endpoint_delete
SELECT webhook_endpoint_delete(%(id)s, %(actor)s) AS deleted

-- name: endpoint_rotate
SELECT webhook_endpoint_rotate(%(id)s, %(secret)s, %(grace)s, %(actor)s) AS previous_secret_until

-- name: endpoint_list
-- Every live endpoint, or the one named by `id` (NULL: all).
SELECT id, url, events, enabled, disabled_reason, created_at, previous_until AS previous_secret_until
  FROM webhook_endpoints
 WHERE deleted_at IS NULL AND (%(id)s::text IS NULL OR id = %(id)s::text)
 ORDER BY created_at, id

-- name: endpoint_exists
SELECT deleted_at IS NULL AS live FROM webhook_endpoints WHERE id = %(id)s

-- name: delivery_page
-- An endpoint's deliveries, newest first, after the cursor (an id of the page before).
SELECT d.id, d.event_id, d.type, d.status, d.attempts, d.last_status, d.last_error, d.next_attempt_at,
       d.created_at, d.finished_at
  FROM webhook_deliveries d
 WHERE d.endpoint_id = %(endpoint_id)s
   AND (%(status)s::text IS NULL OR d.status = %(status)s)
   AND (%(before)s::bigint IS NULL OR d.id < %(before)s)
 ORDER BY d.id DESC
 LIMIT %(limit)s

-- name: delivery_retry
-- A waiting or failed delivery of a live endpoint made due now. No row back: delivered already, or
-- its endpoint is disabled or deleted, or no such delivery (delivery_state says which).
UPDATE webhook_deliveries d
   SET status = 'pending', next_attempt_at = now(), finished_at = NULL
  FROM webhook_endpoints e
 WHERE d.id = %(id)s AND e.id = d.endpoint_id AND d.status <> 'delivered' AND e.enabled AND e.deleted_at IS NULL
RETURNING d.id, d.event_id, d.type, d.status, d.attempts, d.last_status, d.last_error, d.next_attempt_at,
          d.created_at, d.finished_at

-- name: delivery_state
SELECT d.status, e.enabled AND e.deleted_at IS NULL AS endpoint_live
  FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id
 WHERE d.id = %(id)s
