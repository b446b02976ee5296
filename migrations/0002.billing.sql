-- depends: 0001.core
-- Billing: the webhook inbox, each provider subscription's last applied state, learned customer links.
--
-- Distribution (see DESIGN "Scale"): these tables are found by the provider's ids, because an event
-- does not know our account until it is resolved, and a subscription can move between accounts
-- (RevenueCat TRANSFER). So they are keyed by (provider, provider id), carry account_id as a column
-- with an index, and every statement that changes an account is keyed by its account_id. Under
-- Citus they would be distributed by their provider key; webhooks are not on the take hot path.

-- Every verified delivery, once per (provider, event_id). `received` exists only inside the
-- transaction that stores the row: a committed row always holds its outcome.
CREATE TABLE webhook_events (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    provider        text NOT NULL CHECK (provider IN ('stripe', 'revenuecat')),
    event_id        text NOT NULL CHECK (length(event_id) BETWEEN 1 AND 255),
    type            text NOT NULL CHECK (length(type) BETWEEN 1 AND 255),
    occurred_at     timestamptz NOT NULL,           -- the provider's event time
    received_at     timestamptz NOT NULL DEFAULT now(),
    status          text NOT NULL CHECK (status IN ('received', 'applied', 'ignored', 'unmatched', 'failed')),
    error           text,                           -- why it failed (status failed)
    note            text,                           -- what else support should know (stale, unmapped price, ...)
    account_id      text,                           -- the account it was resolved to, when known
    subscription_id text,
    customer_id     text,
    attempts        integer NOT NULL DEFAULT 1,     -- 1 + replays
    processed_at    timestamptz,
    payload         jsonb NOT NULL,                 -- the body as received
    UNIQUE (provider, event_id)
);
CREATE INDEX webhook_events_status ON webhook_events (status, id);
CREATE INDEX webhook_events_provider ON webhook_events (provider, id);

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

GRANT SELECT, INSERT, UPDATE ON webhook_events, subscriptions, customer_links TO quota_app;
