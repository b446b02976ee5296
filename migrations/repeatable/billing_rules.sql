-- The billing rules, each defined once. `quota-ledger migrate` applies this file after the versioned
-- migrations on every run (CREATE OR REPLACE: idempotent; service/migrate.py), so a rule changes here
-- and nowhere else: the one-statement delivery, the locked path, transfers, replays and the expiry
-- job all call these functions; Python parses the plan config, turns notes into text and asks. How
-- plan limits follow a tier is quota's (quota_limits.sql), called from here. docs/design/billing.md
-- says why the rules sit here and what they cost.
--
-- Only functions live here, never tables or data: a function's signature is its contract, so changing
-- one (its arguments or result type) needs a versioned migration that drops the old one first.
-- Plain SQL functions that are one expression are inlined by the planner into the statements that
-- call them, so the hot path pays nothing for the indirection.

-- The lapse rule, part 1: the subscription statuses that keep a paid plan's limits.
CREATE OR REPLACE FUNCTION billing_keeps_access(status text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT status IN ('active', 'trialing', 'past_due')
$$;

-- Statuses that end a subscription.
CREATE OR REPLACE FUNCTION billing_subscription_ended(status text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT status IN ('canceled', 'expired')
$$;

-- The lapse rule, part 2: a paid plan whose status keeps no access falls back to the free plan's
-- limits (the tier itself stays as the provider last said).
CREATE OR REPLACE FUNCTION billing_is_lapsed(plan text, status text, free_plan text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT plan <> free_plan AND NOT billing_keeps_access(status)
$$;

-- The access ranking, for choosing an account's deciding subscription (lower wins): access
-- (active, trialing) beats grace (past_due) beats lapsed (paused, unpaid, incomplete) beats ended.
CREATE OR REPLACE FUNCTION subscription_access_rank(status text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN status = 'past_due' THEN 1
                WHEN billing_keeps_access(status) THEN 0
                WHEN billing_subscription_ended(status) THEN 3
                ELSE 2 END
$$;

-- A subscription's lifecycle, for breaking ties between events of the same provider second (Stripe's
-- `created` has 1 s resolution and Stripe does not order deliveries): the later stage wins, so every
-- delivery order ends in the same state. incomplete, then trialing, active, past_due, unpaid,
-- paused, then the ended ones. Every status has its own rank: a tie between two different statuses
-- always has one answer. (A position in a list rather than `CASE status WHEN ...`: Citus 13.2,
-- sending billing_deliver's upsert to the nodes, turns the WHEN values of a simple CASE into NULLs.)
CREATE OR REPLACE FUNCTION subscription_lifecycle_rank(status text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(array_position(ARRAY['incomplete', 'trialing', 'active', 'past_due', 'unpaid',
                                         'paused', 'canceled', 'expired'], status) - 1, -1)
$$;

-- The best-subscription choice: the subscription that decides an account's tier and status, the
-- best subscription_access_rank, then the newest event, then the id. `p_*` stands in for one
-- subscription as a statement is about to store it (its own write is not visible to the statement
-- that makes it), in place of the stored row of that id; p_subscription_id NULL: the stored rows
-- alone. p_without_temporary leaves out the account's temporary grants of p_provider (a real
-- purchase's event supersedes them). PL/pgSQL, not an inlined SQL function: Citus refuses a SQL
-- function that reads a reference table when its arguments are parameters (billing_deliver's), and
-- plans a PL/pgSQL function's query as a query of its own.
CREATE OR REPLACE FUNCTION billing_deciding_subscription(
    p_account_id text, p_provider text, p_subscription_id text, p_plan text, p_status text,
    p_event_at timestamptz, p_without_temporary boolean
) RETURNS TABLE (plan text, status text) LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT c.plan, c.status
      FROM (SELECT s.subscription_id, s.plan, s.status::text AS status, s.event_at
              FROM subscriptions s
             WHERE s.account_id = p_account_id
               AND NOT coalesce(s.provider = p_provider AND s.subscription_id = p_subscription_id, false)
               AND NOT coalesce(p_without_temporary AND s.provider = p_provider
                                AND s.subscription_id LIKE 'temporary:%', false)
            UNION ALL
            SELECT p_subscription_id, p_plan, p_status, p_event_at
             WHERE p_subscription_id IS NOT NULL) c
     ORDER BY subscription_access_rank(c.status), c.event_at DESC, c.subscription_id
     LIMIT 1;
END
$$;

-- The ordering rule: does an event (new_*) replace a subscription's stored state (stored_*)?
-- A final subscription (Stripe canceled) is never reopened. A newer provider time wins. At equal
-- time: an event that opens the subscription (Stripe `customer.subscription.created`) never
-- overrides a stored state, since whatever is stored came after the creation; otherwise the later
-- lifecycle stage wins, and at the same stage the greater event id (arbitrary, but the same answer
-- in every delivery order; the same event again re-applies, which changes nothing).
CREATE OR REPLACE FUNCTION billing_event_wins(
    stored_final boolean, stored_at timestamptz, stored_status text, stored_event_id text,
    new_final boolean, new_at timestamptz, new_status text, new_event_id text, new_opens boolean
) RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT NOT (stored_final AND NOT new_final)
       AND (stored_at < new_at
            OR stored_at = new_at AND NOT new_opens
               AND (subscription_lifecycle_rank(new_status), new_event_id)
                   >= (subscription_lifecycle_rank(stored_status), stored_event_id))
$$;

-- Access that ends by time: a status that keeps access, with an end (expires_at) that has passed,
-- is `expired`. Used when an event is applied (a purchase that expired already grants nothing; a
-- refund whose period is over ends access at once) and by the expiry job for the ends that pass
-- without an event.
CREATE OR REPLACE FUNCTION billing_effective_status(status text, expires_at timestamptz, at timestamptz)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN billing_keeps_access(status) AND expires_at <= at THEN 'expired' ELSE status END
$$;

-- A customer keeps the first account it was linked to: link p_customer_id to p_account_id unless it
-- is linked already. Answers the account the customer is linked to and whether this call linked it.
-- The one definition for the delivery (billing_deliver) and customer-link events (apply.sql).
CREATE OR REPLACE FUNCTION billing_link_customer(
    p_provider text, p_customer_id text, p_account_id text, p_event_id text,
    OUT linked_to text, OUT created boolean
) LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    SELECT l.account_id INTO linked_to
      FROM customer_links l
     WHERE l.provider = p_provider AND l.customer_id = p_customer_id;
    created := false;
    IF linked_to IS NULL THEN
        INSERT INTO customer_links AS l (provider, customer_id, account_id, event_id)
        VALUES (p_provider, p_customer_id, p_account_id, p_event_id)
        ON CONFLICT (provider, customer_id) DO NOTHING
        RETURNING l.account_id INTO linked_to;
        created := FOUND;
        IF NOT created THEN  -- linked concurrently: that link stands
            SELECT l.account_id INTO linked_to
              FROM customer_links l
             WHERE l.provider = p_provider AND l.customer_id = p_customer_id;
        END IF;
    END IF;
END
$$;

-- The lock of a billing change on one account, until commit, with its billing_version bumped
-- (service/billing/apply.sql `account_lock`: the locked path, replays, transfers, the expiry job).
-- An UPDATE's lock is FOR NO KEY UPDATE: it does not wait on the FOR KEY SHARE locks that foreign
-- keys to accounts take. No row back: no such account. It and billing_account_for_update are
-- definer functions because everything after them on the account's tables is (billing_set_tier
-- and its audit rows): on Citus one transaction locks and writes an account's node as one user,
-- or the lock held by one user's connection blocks the other's write (docs/design/ledger-writers.md).
CREATE OR REPLACE FUNCTION billing_lock_account(p_account_id text)
RETURNS TABLE (id text, plan text, subscription_status text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $f$
#variable_conflict use_column
BEGIN
RETURN QUERY
UPDATE accounts a
   SET billing_version = a.billing_version + 1
 WHERE a.id = p_account_id
RETURNING a.id::text, a.plan, a.subscription_status::text;
END
$f$;

-- billing_deliver's lock: the account's tier and status, locked until commit (FOR NO KEY UPDATE);
-- its billing_version moves later, and only when the event applies (billing_set_tier's p_bump).
CREATE OR REPLACE FUNCTION billing_account_for_update(p_account_id text)
RETURNS TABLE (plan text, subscription_status text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $f$
#variable_conflict use_column
BEGIN
RETURN QUERY
SELECT a.plan, a.subscription_status::text
  FROM accounts a
 WHERE a.id = p_account_id
   FOR NO KEY UPDATE;
END
$f$;

-- The grant a credit purchase made, for its refund (service/billing/apply.py): by its payment (a
-- Stripe charge names its payment intent alone) or by its reference (a RevenueCat transaction id).
-- p_account_id NULL: of any account (on Citus every shard is asked: the refund's resolve, before the
-- account's lock); else of that account alone (its shard), read again under the lock. A definer
-- function because the lock and the void around it are the owner's: on Citus a read of the account's
-- placements as the service's role after the owner wrote them is refused.
CREATE OR REPLACE FUNCTION credit_purchased(
    p_provider text, p_payment_ref text, p_reference text, p_account_id text
) RETURNS TABLE (account_id text, grant_id bigint, units bigint, voided bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $f$
BEGIN
    RETURN QUERY
    SELECT g.account_id, g.id, g.units, coalesce(g.voided, 0)
      FROM grants g
     WHERE g.source = p_provider AND (g.payment_ref = p_payment_ref OR g.source_ref = p_reference)
       AND (p_account_id IS NULL OR g.account_id = p_account_id)
     ORDER BY g.id
     LIMIT 1;
END
$f$;

-- The account follows its deciding subscription (billing_deciding_subscription): its tier becomes
-- that subscription's plan (its own tier when that maps to no plan), its status that subscription's
-- status, and `expired` when it has no subscription left (its last one moved away: no access, like
-- an ended one). When tier or status change, the plan limits follow (quota_set_limits_for_plan in
-- quota_limits.sql, audited). The one definition for every billing change: the delivery
-- (billing_deliver), the locked path's previous owner, transfers, replays and the expiry job.
--
-- The caller holds the account's lock and passes its tier and status as read under it.
-- p_without_temporary_of: a provider whose temporary grants no longer count (a real purchase's
-- event supersedes them); NULL: all count. p_bump: move billing_version here too (billing_deliver;
-- account_lock has moved it for the other callers). Returns the number of limit changes; NULL:
-- tier and status unchanged (the limits are then not looked at: they cost even when they change
-- nothing).
CREATE OR REPLACE FUNCTION billing_set_tier(
    p_account_id text, p_plan text, p_status text, p_without_temporary_of text, p_bump boolean,
    p_actor text, p_free_plan text, p_plan_names text[], p_plan_metrics text[], p_plan_limits bigint[]
) RETURNS integer
-- A definer function: the account's update, its counters' limits and their audit rows are written by
-- the owner, as the lock before them was (billing_lock_account, billing_account_for_update). It reads
-- the subscriptions its caller may just have written as the service's role (reference tables on
-- Citus, which the coordinator reads from its own copy, in this transaction).
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
    v_plan text;
    v_status text;
    v_now timestamptz := now();  -- a value, as in billing_deliver (Citus and now(), see there)
BEGIN
    SELECT b.plan, b.status INTO v_plan, v_status
      FROM billing_deciding_subscription(p_account_id, p_without_temporary_of, NULL, NULL, NULL, NULL,
                                         p_without_temporary_of IS NOT NULL) b;
    v_plan := coalesce(v_plan, p_plan);
    v_status := coalesce(v_status, 'expired');
    IF (v_plan, v_status) IS NOT DISTINCT FROM (p_plan, p_status) THEN
        IF p_bump THEN
            UPDATE accounts a SET billing_version = a.billing_version + 1 WHERE a.id = p_account_id;
        END IF;
        RETURN NULL;
    END IF;
    UPDATE accounts a
       SET plan = v_plan, subscription_status = v_status,
           billing_version = a.billing_version + p_bump::int, updated_at = v_now
     WHERE a.id = p_account_id;
    PERFORM event_emit(p_account_id, 'account.plan_changed', jsonb_build_object(
        'account_id', p_account_id,
        'previous', jsonb_build_object('plan', p_plan, 'status', p_status),
        'current', jsonb_build_object('plan', v_plan, 'status', v_status),
        'cause', plan_change_cause(p_actor)));
    -- another plan may have other thresholds: each counter looks at them again at its next take
    UPDATE quotas q SET alert_pct = 1 WHERE q.account_id = p_account_id AND q.alert_pct IS DISTINCT FROM 1;
    RETURN quota_set_limits_for_plan(p_account_id, v_plan, billing_is_lapsed(v_plan, v_status, p_free_plan),
                                     p_actor, p_free_plan, p_plan_names, p_plan_metrics, p_plan_limits);
END
$$;

-- A subscription event's delivery, whole: dedupe and store it, apply the ordering rule to the
-- subscription, link the customer, decide the account's tier and status from all its
-- subscriptions, and bring its plan limits in line (audit rows). Called as one statement
-- (`SELECT * FROM billing_deliver(...)`, service/billing/apply.sql), in autocommit the whole delivery
-- in one round trip and one commit; the same on one PostgreSQL and on Citus.
--
-- The account is p_account_id, and the first thing the function does is lock it (FOR NO KEY UPDATE,
-- which does not wait on the FOR KEY SHARE locks of foreign keys; billing_account_for_update). Every
-- transaction that changes an account's subscriptions holds that lock (account_lock, the expiry job,
-- this function), and each statement below takes a fresh snapshot under READ COMMITTED (a VOLATILE
-- function), so every statement after the lock sees every change to the account's subscriptions
-- committed before it, and a concurrent delivery for the same account waits rather than decides
-- from an old snapshot. Every statement names the account for the account tables (accounts, and
-- quotas and audit_log in billing_set_tier), so on Citus each is routed to the account's shard; the
-- billing tables are reference tables. It runs as its caller, the service's role, which writes the
-- billing tables; the account's tables are locked and written by the owner alone, in the definer
-- functions it calls. A statement of its own each, because Citus mishandles the intermediate
-- results of a chain of data-modifying CTEs (README "Scaling out").
--
-- Who picks the account (apply.deliver_subscription): the first id the event names, when it names one
-- (the common case), with p_resolved false: if that account exists, it is the one billing_account
-- would pick (named ids come first); if it does not, nothing is written and the answer is
-- `unresolved`. Otherwise billing_account picks it first, and p_resolved is true (NULL: unmatched,
-- the event is stored so). p_store false (the locked path, a replay): the inbox row is the caller's; only the outcome is said.
-- p_locked: the caller holds the account's lock in a transaction (the locked path), so a
-- subscription may move here from another account, and the caller then sets `moved_from`'s tier;
-- otherwise such a move raises serialization_failure (billing_take_locked_path), all of it rolls
-- back, and the caller takes the locked path, which locks both accounts. So does a copy of the event
-- stored meanwhile by a delivery that found another account (the unique index is the dedupe).
--
-- The answer: the inbox row (NULL: a duplicate, or not stored), the event's status (applied,
-- ignored, unmatched, unresolved) and note, its account, the account a subscription moved from,
-- the number of limit changes (NULL: tier and status unchanged), and `waiting`: stored unmatched
-- events may now apply (delivery.apply_waiting), looked for only when the event opened a subscription
-- or linked a customer, which is rare.
CREATE OR REPLACE FUNCTION billing_deliver(
    p_account_id text, p_resolved boolean, p_store boolean, p_locked boolean,
    p_provider text, p_event_id text, p_type text, p_occurred_at timestamptz, p_payload text,
    p_account_ids text[], p_subscription_id text, p_customer_id text,
    p_plan text, p_status text, p_status_if_new text, p_final boolean, p_opens boolean,
    p_expires_at timestamptz, p_supersedes_temporary boolean,
    p_note text, p_unmatched_note text, p_actor text,
    p_free_plan text, p_plan_names text[], p_plan_metrics text[], p_plan_limits bigint[],
    OUT inbox_id bigint, OUT status text, OUT note text, OUT account_id text, OUT moved_from text,
    OUT limit_changes integer, OUT waiting boolean
) LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_plan text;            -- the account's tier and status before the event
    v_status text;
    v_prior text;           -- the subscription's owner before the event; NULL: it is new
    v_applied boolean := false;
    v_linked_to text;       -- the account the customer is linked to
    v_linked_now boolean := false;  -- this event linked it
    -- The transaction's time, as a value: Citus refuses a call of now() in an upsert's SET.
    v_now timestamptz := now();
BEGIN
    waiting := false;
    IF p_account_id IS NOT NULL THEN
        SELECT l.plan, l.subscription_status INTO v_plan, v_status
          FROM billing_account_for_update(p_account_id) l;
    END IF;
    IF v_plan IS NULL THEN  -- no such account (plan is NOT NULL)
        IF NOT p_resolved THEN
            status := 'unresolved';
            RETURN;
        END IF;
        status := 'unmatched';
        note := p_unmatched_note;
        IF p_store THEN
            INSERT INTO webhook_events (provider, event_id, type, occurred_at, status, note,
                                        subscription_id, customer_id, named_accounts, payload,
                                        processed_at)
            VALUES (p_provider, p_event_id, p_type, p_occurred_at, 'unmatched', p_unmatched_note,
                    p_subscription_id, p_customer_id, p_account_ids, p_payload::json, v_now)
            ON CONFLICT (provider, event_id) DO NOTHING
            RETURNING id INTO inbox_id;
        END IF;
        RETURN;
    END IF;
    account_id := p_account_id;

    -- Dedupe: a copy delivered before, or concurrently for the same account (it held the lock until
    -- it committed), is stored already. Nothing changes; no inbox row back.
    IF p_store AND EXISTS (SELECT FROM webhook_events w
                            WHERE w.provider = p_provider AND w.event_id = p_event_id) THEN
        status := 'ignored';
        RETURN;
    END IF;

    -- The ordering rule (billing_event_wins), under the subscription's row lock. A status that keeps
    -- access with an end that has passed is stored `expired` (billing_effective_status).
    INSERT INTO subscriptions AS s (provider, subscription_id, account_id, plan, status, final,
                                    event_at, event_id, expires_at)
    VALUES (p_provider, p_subscription_id, p_account_id, p_plan,
            billing_effective_status(coalesce(p_status, p_status_if_new), p_expires_at, v_now),
            p_final, p_occurred_at, p_event_id, p_expires_at)
    ON CONFLICT (provider, subscription_id) DO UPDATE
       SET prior_account_id = s.account_id,
           account_id = EXCLUDED.account_id,
           plan = coalesce(EXCLUDED.plan, s.plan),
           status = billing_effective_status(coalesce(p_status, s.status), EXCLUDED.expires_at, v_now),
           final = EXCLUDED.final,
           event_at = EXCLUDED.event_at,
           event_id = EXCLUDED.event_id,
           expires_at = EXCLUDED.expires_at,
           updated_at = v_now
     WHERE billing_event_wins(s.final, s.event_at, s.status, s.event_id, EXCLUDED.final,
                              EXCLUDED.event_at, coalesce(p_status, s.status), EXCLUDED.event_id,
                              p_opens)
    RETURNING s.prior_account_id INTO v_prior;
    v_applied := FOUND;

    IF NOT v_applied THEN
        status := 'ignored';
        SELECT CASE WHEN cur.final AND cur.event_at <= p_occurred_at
                    THEN 'subscription ended (' || cur.status || ') for good; a later event does '
                         'not reopen it'
                    ELSE 'older than the stored state (' || cur.status || ' from ' || cur.event_id
                         || ' at ' || cur.event_at || '); not applied' END
          INTO note
          FROM subscriptions cur
         WHERE cur.provider = p_provider AND cur.subscription_id = p_subscription_id;
    ELSE
        IF v_prior <> p_account_id THEN
            IF NOT p_locked THEN
                PERFORM billing_take_locked_path('the subscription moves from another account');
            END IF;
            moved_from := v_prior;
        END IF;

        -- A RevenueCat event about a real purchase ends the account's temporary entitlement
        -- grants, which stood in for it.
        IF p_supersedes_temporary THEN
            UPDATE subscriptions t
               SET status = 'expired', expires_at = least(t.expires_at, v_now), updated_at = v_now
             WHERE t.account_id = p_account_id AND t.provider = p_provider
               AND t.subscription_id LIKE 'temporary:%' AND t.subscription_id <> p_subscription_id
               AND t.status <> 'expired';
        END IF;

        IF p_customer_id IS NOT NULL THEN
            SELECT l.linked_to, l.created INTO v_linked_to, v_linked_now
              FROM billing_link_customer(p_provider, p_customer_id, p_account_id, p_event_id) l;
        END IF;

        -- The account follows its deciding subscription, this event's write included; its version
        -- moves whenever its subscriptions changed.
        limit_changes := billing_set_tier(p_account_id, v_plan, v_status,
                                          CASE WHEN p_supersedes_temporary THEN p_provider END, true,
                                          p_actor, p_free_plan, p_plan_names, p_plan_metrics, p_plan_limits);

        status := 'applied';
        note := nullif(concat_ws('; ', p_note,
                                 'customer ' || quote_literal(p_customer_id) || ' stays linked to account '
                                 || quote_literal(nullif(v_linked_to, p_account_id))), '');
        IF v_prior IS NULL OR v_linked_now THEN
            waiting := EXISTS (SELECT FROM webhook_events w
                                WHERE w.status = 'unmatched' AND w.provider = p_provider
                                  AND (w.subscription_id = p_subscription_id
                                       OR w.customer_id = p_customer_id
                                       OR w.named_accounts && p_account_ids));
        END IF;
    END IF;

    IF p_store THEN
        INSERT INTO webhook_events (provider, event_id, type, occurred_at, status, note, account_id,
                                    subscription_id, customer_id, payload, processed_at)
        VALUES (p_provider, p_event_id, p_type, p_occurred_at, status, note, p_account_id,
                p_subscription_id, p_customer_id, p_payload::json, v_now)
        ON CONFLICT (provider, event_id) DO NOTHING
        RETURNING id INTO inbox_id;
        IF inbox_id IS NULL AND v_applied THEN
            PERFORM billing_take_locked_path('a copy of this event was stored meanwhile');
        END IF;
    END IF;
END
$$;

-- An admin's replay of a stored event (service/billing/delivery.py) is an admin action: one audit row
-- (`event_replayed`, naming p_actor) with what became of the event, read from its inbox row as the
-- replay left it in this transaction: its account (none when the replay failed: nothing of it was
-- applied), status and error. The facts come from the row, not from the caller.
CREATE OR REPLACE FUNCTION audit_event_replayed(p_inbox_id bigint, p_actor text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $f$
DECLARE
    w record;
BEGIN
    SELECT e.id, e.provider::text AS provider, e.event_id, e.type, e.status::text AS status, e.error,
           e.account_id
      INTO w
      FROM webhook_events e
     WHERE e.id = p_inbox_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no stored webhook event has id %', p_inbox_id USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM audit_append(p_actor, 'event_replayed',
                         CASE WHEN w.status = 'failed' THEN '' ELSE coalesce(w.account_id, '') END, NULL,
                         'null',
                         jsonb_build_object('inbox_id', w.id, 'provider', w.provider, 'event_id', w.event_id,
                                            'type', w.type, 'status', w.status, 'error', w.error));
END
$f$;

-- Who may call the definer functions (set_function_grants, migrations/0020): the service's role those
-- it calls (the delivery calls billing_account_for_update and billing_set_tier as its caller).
CALL set_function_grants(
    ARRAY['billing_lock_account(text)',
          'billing_account_for_update(text)',
          'billing_set_tier(text, text, text, text, boolean, text, text, text[], text[], bigint[])',
          'audit_event_replayed(bigint, text)',
          'credit_purchased(text, text, text, text)'],
    ARRAY[]::text[]);
