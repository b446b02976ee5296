-- depends: 0001.core
-- Billing: the webhook inbox, each provider subscription's last applied state, learned customer links.
--
-- Distribution (see DESIGN "Scale"): these tables are found by the provider's ids, because an event
-- does not know our account until it is resolved, and a subscription can move between accounts
-- (RevenueCat TRANSFER). So they are keyed by (provider, provider id), carry account_id as a column
-- with an index, and every statement that changes an account is keyed by its account_id. Under
-- Citus they would be distributed by their provider key; webhooks are not on the take hot path.

-- Every verified delivery, once per (provider, event_id), with its outcome. The row is written in
-- the transaction that applies the event, so a committed row always holds what became of it.
CREATE TABLE webhook_events (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    provider        text NOT NULL CHECK (provider IN ('stripe', 'revenuecat')),
    event_id        text NOT NULL CHECK (length(event_id) BETWEEN 1 AND 255),
    type            text NOT NULL CHECK (length(type) BETWEEN 1 AND 255),
    occurred_at     timestamptz NOT NULL,           -- the provider's event time
    received_at     timestamptz NOT NULL DEFAULT now(),
    status          text NOT NULL CHECK (status IN ('applied', 'ignored', 'unmatched', 'failed')),
    error           text,                           -- why it failed (status failed)
    note            text,                           -- what else support should know (stale, unmapped price, ...)
    account_id      text,                           -- the account it was resolved to, when known
    subscription_id text,
    customer_id     text,
    attempts        integer NOT NULL DEFAULT 1,     -- 1 + replays
    processed_at    timestamptz,
    payload         json NOT NULL,                  -- the body as received, byte for byte
    UNIQUE (provider, event_id)
);
-- Support's queue: what needs a look. Other pages scan the primary key; every delivery writes this
-- table, so it carries no index it does not need.
CREATE INDEX webhook_events_attention ON webhook_events (status, id) WHERE status IN ('unmatched', 'failed');
-- lz4 compresses a stored body several times faster than the default pglz; a server built without
-- lz4 keeps pglz.
DO $$
BEGIN
    ALTER TABLE webhook_events ALTER COLUMN payload SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported THEN
    NULL;
END
$$;

-- One row per provider subscription: the plan and status its newest applied event gave it, and
-- that event's provider time. An event older than `event_at` is not applied; a `final` subscription
-- (Stripe canceled) is never reopened. The account's tier and status follow its subscriptions.
CREATE TABLE subscriptions (
    provider         text NOT NULL CHECK (provider IN ('stripe', 'revenuecat')),
    subscription_id  text NOT NULL,
    account_id       text NOT NULL REFERENCES accounts (id),
    prior_account_id text,                         -- the owner before the last change (transfers)
    plan             text,                         -- NULL: no price or entitlement mapped to a plan yet
    status           text NOT NULL CHECK (status IN
                         ('trialing', 'active', 'past_due', 'unpaid', 'incomplete', 'paused',
                          'canceled', 'expired')),
    final            boolean NOT NULL DEFAULT false,
    event_at         timestamptz NOT NULL,
    event_id         text NOT NULL,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, subscription_id)
);
CREATE INDEX subscriptions_account ON subscriptions (account_id);

-- Provider customers learned from events (Stripe checkout, subscription metadata, invoices).
-- A customer linked by the product (accounts.stripe_customer_id) takes precedence over these.
CREATE TABLE customer_links (
    provider    text NOT NULL CHECK (provider IN ('stripe', 'revenuecat')),
    customer_id text NOT NULL,
    account_id  text NOT NULL REFERENCES accounts (id),
    event_id    text NOT NULL,                     -- the event that taught us the link
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, customer_id)
);
CREATE INDEX customer_links_account ON customer_links (account_id);

-- The accounts an event may be for, best first: the ids it names (in its order), the subscription's
-- current owner, the customer linked by the product (accounts.stripe_customer_id), the customer
-- linked by an earlier event. Unknown ids are included; callers join accounts. A plain SQL
-- function, inlined by the planner into the queries that use it.
CREATE FUNCTION billing_account_candidates(
    p_provider text, p_account_ids text[], p_subscription_id text, p_customer_id text
) RETURNS TABLE (account_id text, rank bigint) LANGUAGE sql STABLE AS $$
    SELECT u.id, u.n FROM unnest(p_account_ids) WITH ORDINALITY AS u (id, n)
    UNION ALL
    SELECT s.account_id, 1000 FROM subscriptions s
     WHERE s.provider = p_provider AND s.subscription_id = p_subscription_id
    UNION ALL
    SELECT a.id, 2000 FROM accounts a
     WHERE p_provider = 'stripe' AND a.stripe_customer_id = p_customer_id
    UNION ALL
    SELECT l.account_id, 3000 FROM customer_links l
     WHERE l.provider = p_provider AND l.customer_id = p_customer_id
$$;

GRANT SELECT, INSERT, UPDATE ON webhook_events, subscriptions, customer_links TO quota_app;
