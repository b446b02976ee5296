-- depends: 0004.billing_version
-- Column rules as domains instead of table CHECK constraints, on the tables that every webhook
-- delivery and every take writes. Same rules, same SQLSTATE (23514, check_violation) when broken.
--
-- Why: Postgres evaluates every CHECK constraint of a table on every row an UPDATE writes, whatever
-- columns it sets, and reads the constraints' stored expressions back from text once per statement
-- that writes the table. A domain's rule is cached with its type and is checked only where a value
-- is assigned to a column of that type: an UPDATE of an account's tier does not re-check its id
-- against the id pattern. The measured gain on the one-statement webhook delivery is in
-- bench/webhooks.md.
--
-- Left as they were: quotas' limit columns (the generated effective limit reads them, and a column
-- that a generated column reads cannot change type), the two-column rule on quotas, and the ledger,
-- whose rows are never updated.
--
-- How, without rewriting the tables: a column can change to a domain over its own type in place
-- (no rewrite, indexes and foreign keys kept) only while the domain has no rule; so the domains are
-- created bare, the columns switched, and the rules then added NOT VALID and validated, which reads
-- the existing values once and rewrites nothing.

CREATE DOMAIN account_key AS text;
CREATE DOMAIN account_kind AS text;
CREATE DOMAIN account_billing_status AS text;  -- 'none' until a provider first says otherwise
CREATE DOMAIN quota_units AS bigint;
CREATE DOMAIN quota_period AS text;
CREATE DOMAIN billing_provider AS text;
CREATE DOMAIN provider_subscription_status AS text;  -- as the adapters map it; never 'none'
CREATE DOMAIN provider_event_text AS text;
CREATE DOMAIN inbox_status AS text;

ALTER TABLE accounts
    DROP CONSTRAINT accounts_id_check, ALTER COLUMN id TYPE account_key,
    DROP CONSTRAINT accounts_kind_check, ALTER COLUMN kind TYPE account_kind,
    DROP CONSTRAINT accounts_subscription_status_check,
    ALTER COLUMN subscription_status TYPE account_billing_status;
ALTER TABLE quotas
    DROP CONSTRAINT quotas_period_check, ALTER COLUMN period TYPE quota_period,
    DROP CONSTRAINT quotas_used_check, ALTER COLUMN used TYPE quota_units;
ALTER TABLE webhook_events
    DROP CONSTRAINT webhook_events_provider_check, ALTER COLUMN provider TYPE billing_provider,
    DROP CONSTRAINT webhook_events_event_id_check, ALTER COLUMN event_id TYPE provider_event_text,
    DROP CONSTRAINT webhook_events_type_check, ALTER COLUMN type TYPE provider_event_text,
    DROP CONSTRAINT webhook_events_status_check, ALTER COLUMN status TYPE inbox_status;
ALTER TABLE subscriptions
    DROP CONSTRAINT subscriptions_provider_check, ALTER COLUMN provider TYPE billing_provider,
    DROP CONSTRAINT subscriptions_status_check, ALTER COLUMN status TYPE provider_subscription_status;
ALTER TABLE customer_links
    DROP CONSTRAINT customer_links_provider_check, ALTER COLUMN provider TYPE billing_provider;

ALTER DOMAIN account_key ADD CONSTRAINT account_key_check
    CHECK (VALUE ~ '^[A-Za-z0-9._:@-]{1,128}$') NOT VALID;
ALTER DOMAIN account_kind ADD CONSTRAINT account_kind_check CHECK (VALUE IN ('user', 'team')) NOT VALID;
ALTER DOMAIN account_billing_status ADD CONSTRAINT account_billing_status_check CHECK (VALUE IN
    ('none', 'trialing', 'active', 'past_due', 'unpaid', 'incomplete', 'paused', 'canceled', 'expired'))
    NOT VALID;
ALTER DOMAIN quota_units ADD CONSTRAINT quota_units_check CHECK (VALUE >= 0) NOT VALID;
ALTER DOMAIN quota_period ADD CONSTRAINT quota_period_check
    CHECK (VALUE ~ '^[0-9]{4}-(0[1-9]|1[0-2])$') NOT VALID;
ALTER DOMAIN billing_provider ADD CONSTRAINT billing_provider_check
    CHECK (VALUE IN ('stripe', 'revenuecat')) NOT VALID;
ALTER DOMAIN provider_subscription_status ADD CONSTRAINT provider_subscription_status_check CHECK (VALUE IN
    ('trialing', 'active', 'past_due', 'unpaid', 'incomplete', 'paused', 'canceled', 'expired')) NOT VALID;
ALTER DOMAIN provider_event_text ADD CONSTRAINT provider_event_text_check
    CHECK (length(VALUE) BETWEEN 1 AND 255) NOT VALID;
ALTER DOMAIN inbox_status ADD CONSTRAINT inbox_status_check
    CHECK (VALUE IN ('applied', 'ignored', 'unmatched', 'failed')) NOT VALID;

ALTER DOMAIN account_key VALIDATE CONSTRAINT account_key_check;
ALTER DOMAIN account_kind VALIDATE CONSTRAINT account_kind_check;
ALTER DOMAIN account_billing_status VALIDATE CONSTRAINT account_billing_status_check;
ALTER DOMAIN quota_units VALIDATE CONSTRAINT quota_units_check;
ALTER DOMAIN quota_period VALIDATE CONSTRAINT quota_period_check;
ALTER DOMAIN billing_provider VALIDATE CONSTRAINT billing_provider_check;
ALTER DOMAIN provider_subscription_status VALIDATE CONSTRAINT provider_subscription_status_check;
ALTER DOMAIN provider_event_text VALIDATE CONSTRAINT provider_event_text_check;
ALTER DOMAIN inbox_status VALIDATE CONSTRAINT inbox_status_check;
