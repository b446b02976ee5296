-- depends: 0002.billing
-- One-statement webhook deliveries (see service/billing/apply.sql, `subscription_delivery`).
--
-- A delivery decides the account's tier and status from all of the account's subscriptions. Done in
-- one statement, it reads them in the statement's snapshot, which can predate a change committed by
-- a concurrent delivery for the same account. `billing_version` makes that visible: every
-- transaction that changes an account's subscriptions bumps it (under the account's row lock), and
-- the one-statement delivery locks the account row only if the version is still the one its
-- snapshot read. The row lock re-checks that condition on the newest row version, so a concurrent
-- change, committed or in progress, makes the statement give up and the delivery take the path
-- that locks the account before it reads (service/billing/inbox.py).
ALTER TABLE accounts ADD COLUMN billing_version bigint NOT NULL DEFAULT 0;

-- Raised by a one-statement delivery that cannot decide on its own (a concurrent change to the
-- account, a duplicate, a subscription moving between accounts): the statement and everything it
-- wrote roll back, and the caller takes the locked path. SQLSTATE 40001 (serialization_failure),
-- because that is what it is: this statement's snapshot was not good enough.
CREATE FUNCTION billing_take_locked_path(reason text) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RAISE EXCEPTION 'one-statement delivery gives way to the locked path: %', reason
        USING ERRCODE = 'serialization_failure', HINT = 'quota-ledger:locked-path';
END
$$;

-- How much access a subscription status gives, for choosing an account's deciding subscription
-- (lower wins): access (active, trialing) beats grace (past_due) beats lapsed (paused, unpaid,
-- incomplete) beats ended (canceled, expired). One definition for every statement that chooses;
-- a plain SQL function, inlined by the planner.
CREATE FUNCTION subscription_access_rank(status text) RETURNS integer LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE status WHEN 'active' THEN 0 WHEN 'trialing' THEN 0 WHEN 'past_due' THEN 1
                       WHEN 'canceled' THEN 3 WHEN 'expired' THEN 3 ELSE 2 END
$$;

-- The account an event is for, as billing_account_candidates ranks them (the ids the event names,
-- in its order, the first that exists; the subscription's current owner; the customer linked by
-- the product; the customer linked by an earlier event), as one row (NULL: unmatched). COALESCE
-- evaluates its arguments in order and stops at the first that is not NULL, so the later lookups
-- run only when the earlier ones find nothing: the common event names its account and costs one
-- lookup, not four and a sort. A set-returning SQL function, so that the planner inlines it.
CREATE FUNCTION billing_account_for(
    p_provider text, p_account_ids text[], p_subscription_id text, p_customer_id text
) RETURNS TABLE (account_id text) LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT u.id FROM unnest(p_account_ids) WITH ORDINALITY AS u (id, n)
          WHERE EXISTS (SELECT FROM accounts a WHERE a.id = u.id)
          ORDER BY u.n LIMIT 1),
        (SELECT s.account_id FROM subscriptions s
          WHERE s.provider = p_provider AND s.subscription_id = p_subscription_id),
        (SELECT a.id FROM accounts a
          WHERE p_provider = 'stripe' AND a.stripe_customer_id = p_customer_id),
        (SELECT l.account_id FROM customer_links l
          WHERE l.provider = p_provider AND l.customer_id = p_customer_id))
$$;
DROP FUNCTION billing_account_candidates(text, text[], text, text);
