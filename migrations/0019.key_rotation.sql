-- depends: 0018.inbox_retention
-- Key rotation (`quota-ledger keys rotate`, service/keys.py): a service rolls its key without a gap.
-- The rotated key gets an end, expires_at, and stays accepted beside the new key of the same name
-- until then; a key with an end is not the name's live key, so the live-name index leaves it out.
-- revoked_at keeps meaning "revoked by hand, now". Adding a nullable column without a default
-- rewrites nothing; the table holds a handful of rows, so the index is rebuilt in passing.

ALTER TABLE api_keys ADD COLUMN expires_at timestamptz;

DROP INDEX api_keys_live_name;
CREATE UNIQUE INDEX api_keys_live_name ON api_keys (name) WHERE revoked_at IS NULL AND expires_at IS NULL;
