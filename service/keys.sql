-- API keys (service/keys.py): stored as the SHA-256 of the secret, never the secret.

-- name: key_insert
INSERT INTO api_keys (name, role, key_hash) VALUES (%(name)s, %(role)s, %(key_hash)s)

-- name: key_delete
DELETE FROM api_keys WHERE name = %(name)s

-- name: key_revoke
UPDATE api_keys SET revoked_at = now()
 WHERE name = %(name)s AND revoked_at IS NULL
RETURNING role

-- name: key_verify
SELECT name, role FROM api_keys WHERE key_hash = %(key_hash)s AND revoked_at IS NULL

-- name: key_list
SELECT name, role, created_at::text AS created_at, revoked_at::text AS revoked_at
  FROM api_keys
 ORDER BY id
