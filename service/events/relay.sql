-- The relay's claim of a due delivery and the record of its attempt (service/events/relay.py).

-- name: relay_can_sign
-- Whether this connection's role may read the endpoints' signing secrets: a member of quota_relay
-- (migrations/0028), or the tables' owner.
SELECT has_column_privilege('webhook_endpoints', 'secret', 'SELECT')
       AND has_column_privilege('webhook_endpoints', 'previous_secret', 'SELECT')

-- name: relay_claim
-- One due delivery of a live endpoint, locked for the attempt: the row stays locked while it is
-- sent, so another relay skips it, and a relay that dies mid-send releases it for another (or its
-- own restart) to send again. `busy`: endpoints this relay already sends its cap to at once.
SELECT d.id, d.event_id, d.endpoint_id, d.body, d.attempts, e.url, e.secret,
       CASE WHEN e.previous_until > now() THEN e.previous_secret END AS previous_secret,
       e.failing_since IS NOT NULL AS failing
  FROM webhook_deliveries d
  JOIN webhook_endpoints e ON e.id = d.endpoint_id
 WHERE d.status = 'pending' AND d.next_attempt_at <= now()
   AND e.enabled AND e.deleted_at IS NULL
   AND d.endpoint_id <> ALL (%(busy)s::text[])
 ORDER BY d.next_attempt_at
 LIMIT 1
   FOR UPDATE OF d SKIP LOCKED

-- name: relay_delivered
UPDATE webhook_deliveries
   SET status = 'delivered', attempts = attempts + 1, last_status = %(status)s, last_error = NULL,
       finished_at = now()
 WHERE id = %(id)s

-- name: relay_failed_attempt
-- A failed attempt: due again `wait` after it ended (not after the claim's transaction began), or
-- failed for good when the schedule has run out.
UPDATE webhook_deliveries
   SET attempts = attempts + 1, last_status = %(status)s, last_error = %(error)s,
       status = CASE WHEN %(final)s THEN 'failed' ELSE 'pending' END,
       next_attempt_at = CASE WHEN %(final)s THEN next_attempt_at ELSE clock_timestamp() + %(wait)s::interval END,
       finished_at = CASE WHEN %(final)s THEN now() END
 WHERE id = %(id)s

-- name: relay_endpoint_attempted
SELECT webhook_endpoint_attempted(%(endpoint_id)s, %(ok)s, %(gone)s, %(failing_for)s, %(actor)s) AS disabled
