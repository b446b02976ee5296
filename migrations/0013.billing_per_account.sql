-- depends: 0012.citus
-- Webhook deliveries and plan changes per account, and one Stripe customer per account, on plain
-- PostgreSQL and on Citus alike (README "Scaling out").
--
-- stripe_customers: the product's link of a Stripe customer to an account
-- (`PUT /v1/accounts/{id}` with stripe_customer_id), one row per customer. Its primary key is the
-- guarantee that UNIQUE (stripe_customer_id) on accounts gave: on Citus a unique constraint on a
-- table distributed by account cannot hold a column other than the account (0012 dropped it), so
-- the customer gets a table keyed by itself, distributed by the customer id, and the account upsert
-- writes it in its transaction (service/quota/accounts.py: claim the new customer, release the one
-- it replaces). It is also how a delivery finds the account of a customer: one row by its key,
-- on one shard, where accounts.stripe_customer_id could only be searched on every shard. The same
-- design on plain PostgreSQL, so both refuse a customer linked to another account the same way:
-- the constraint on accounts goes there too. accounts.stripe_customer_id stays, the account's own
-- view of its link.
CREATE TABLE stripe_customers (
    customer_id text PRIMARY KEY,
    account_id  text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
GRANT SELECT, INSERT, UPDATE, DELETE ON stripe_customers TO quota_app;

DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') THEN
        -- One connection per worker for the whole migration (as 0012): the backfill below reads
        -- accounts on every shard, and the function dropped after it is DDL Citus propagates.
        PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);
        -- Its own co-location group: a customer's row lives where its id hashes, not its account's.
        PERFORM create_distributed_table('stripe_customers', 'customer_id', colocate_with => 'none');
    END IF;
END
$$;

INSERT INTO stripe_customers (customer_id, account_id)
SELECT stripe_customer_id, id FROM accounts WHERE stripe_customer_id IS NOT NULL;

ALTER TABLE accounts DROP CONSTRAINT IF EXISTS accounts_stripe_customer_id_key;
DROP INDEX IF EXISTS accounts_stripe_customer;  -- 0012's, on Citus: deliveries read stripe_customers

-- The account an event is for is now found by a statement of its own before the account's part of
-- a delivery runs (service/billing/apply.sql, `billing_account`), so that the account's part can
-- name its account and be routed to one shard; the function that did it inside the delivery goes.
DROP FUNCTION billing_account_for(text, text[], text, text);
