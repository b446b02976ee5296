-- depends: 0006.quotas_follow_plan
-- Provider events as the providers send them (issue 11): access that ends by time, and the stored
-- `unmatched` events that a later link makes applicable.
--
-- subscriptions.expires_at: when the subscription's access ends without any further event
-- (RevenueCat `expiration_at_ms`, a BILLING_ISSUE's grace period end, a temporary entitlement
-- grant's 24 h). NULL: no end in time (Stripe, which always sends an event; a lifetime purchase).
-- The hourly expiry job (service/billing/expiry.py) ends what has passed; the partial index keeps
-- its scan to the few rows that have an end at all.
ALTER TABLE subscriptions ADD COLUMN expires_at timestamptz;
CREATE INDEX subscriptions_expiring ON subscriptions (expires_at) WHERE expires_at IS NOT NULL;

-- webhook_events.named_accounts: the account ids (and RevenueCat aliases) an `unmatched` event
-- names, so that creating or linking an account finds the events waiting for it with an index,
-- not by reading payloads. Written only for unmatched rows. The partial indexes hold unmatched rows
-- only, so the many applied deliveries add nothing to them but a predicate check.
ALTER TABLE webhook_events ADD COLUMN named_accounts text[];
CREATE INDEX webhook_events_waiting_subscription ON webhook_events (provider, subscription_id)
    WHERE status = 'unmatched';
CREATE INDEX webhook_events_waiting_customer ON webhook_events (provider, customer_id)
    WHERE status = 'unmatched';
CREATE INDEX webhook_events_waiting_names ON webhook_events USING gin (named_accounts)
    WHERE status = 'unmatched';

-- The rules themselves (who keeps access, which event wins, which subscription decides, how plan
-- limits follow) are functions in migrations/repeatable/billing_rules.sql, which `migrate` applies
-- after this file on every run (CREATE OR REPLACE), so a rule is changed in one place.
