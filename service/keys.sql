-- API keys (service/keys.py): stored as the SHA-256 of the secret, never the secret.
-- A key is accepted while it is not revoked and has no end (expires_at) or an end still ahead: a
-- rotated key's end is its grace's (migrations/0019). The name's live key is the one with neither.

-- name: key_insert
INSERT INTO api_keys (name, role, key_hash) VALUES (%(name)s, %(role)s, %(key_hash)s)

-- name: key_delete
DELETE FROM api_keys WHERE name = %(name)s

-- name: key_revoke
-- Every key of the name still accepted: the live one and any rotated one in its grace.
UPDATE api_keys SET revoked_at = now()
 WHERE name = %(name)s AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())
RETURNING role, expires_at IS NULL AS live

-- name: key_live
SELECT role, now() + %(grace)s::interval AS old_until
  FROM api_keys
 WHERE name = %(name)s AND revoked_at IS NULL AND expires_at IS NULL

-- name: key_expire
-- A rotation: every key of the name still accepted ends at `until`, or earlier if it already ends
-- sooner (a key rotated before keeps its own end).
UPDATE api_keys SET expires_at = LEAST(expires_at, %(until)s::timestamptz)
 WHERE name = %(name)s AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())

-- name: key_verify
-- expires_in: the seconds left to a rotated key (NULL: no end), so a cache never outlives its grace.
SELECT name, role, extract(epoch FROM expires_at - now())::float8 AS expires_in
  FROM api_keys
 WHERE key_hash = %(key_hash)s AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())

-- name: key_list
SELECT name, role, created_at::text AS created_at, revoked_at::text AS revoked_at,
       expires_at::text AS expires_at, expires_at <= now() AS expired
  FROM api_keys
 ORDER BY id
