-- depends: 0027.events_out
-- The relay's own role (docs/events.md, "Who can do what"): only the process that signs events out
-- reads the endpoints' signing secrets. Until now every member of quota_app could, the web process
-- included, so a bug or an injection there could sign events that product services trust.
--
-- * quota_relay: a group role, a member of quota_app (the relay reads the outbox and writes
--   deliveries as the service does) that may also read webhook_endpoints.secret and
--   .previous_secret. Run `quota-ledger relay` as a login role granted it
--   (`quota-ledger migrate --relay-role NAME`).
-- * quota_app keeps every other column of webhook_endpoints: the admin routes list endpoints and
--   their deliveries without secrets, and create and rotate hand a new secret to the definer
--   functions (migrations/repeatable/webhooks_out.sql), which write it as the tables' owner.
--
-- webhook_endpoints is a plain table on the coordinator on Citus too (0027 distributes only the
-- outbox), so these are plain column privileges; roles and role memberships are propagated to the
-- workers by Citus itself, as quota_app's are.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'quota_relay') THEN
        CREATE ROLE quota_relay NOLOGIN;
    END IF;
END
$$;
GRANT quota_app TO quota_relay;

REVOKE SELECT ON webhook_endpoints FROM quota_app;
GRANT SELECT (id, url, events, enabled, previous_until, failing_since, disabled_reason, created_at, deleted_at)
    ON webhook_endpoints TO quota_app;
GRANT SELECT (secret, previous_secret) ON webhook_endpoints TO quota_relay;
