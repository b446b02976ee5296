-- The webhook delivery as one statement of data-modifying CTEs, as it was before billing_deliver
-- (service/billing/apply.sql at c7b6d76), with the SQL functions it called then, renamed `_before`:
-- the base side of bench/deliver_ab.py. Not part of the service.

CREATE OR REPLACE FUNCTION subscription_lifecycle_rank_before(status text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE status WHEN 'incomplete' THEN 0 WHEN 'trialing' THEN 1 WHEN 'active' THEN 2
                       WHEN 'past_due' THEN 3 WHEN 'unpaid' THEN 4 WHEN 'paused' THEN 5
                       WHEN 'canceled' THEN 6 WHEN 'expired' THEN 7 ELSE -1 END
$$;

CREATE OR REPLACE FUNCTION billing_deciding_subscription_before(
    p_account_id text, p_provider text, p_subscription_id text, p_plan text, p_status text,
    p_event_at timestamptz, p_without_temporary boolean
) RETURNS TABLE (plan text, status text) LANGUAGE sql STABLE AS $$
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
     LIMIT 1
$$;

CREATE OR REPLACE FUNCTION billing_event_wins_before(
    stored_final boolean, stored_at timestamptz, stored_status text, stored_event_id text,
    new_final boolean, new_at timestamptz, new_status text, new_event_id text, new_opens boolean
) RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT NOT (stored_final AND NOT new_final)
       AND (stored_at < new_at
            OR stored_at = new_at AND NOT new_opens
               AND (subscription_lifecycle_rank_before(new_status), new_event_id)
                   >= (subscription_lifecycle_rank_before(stored_status), stored_event_id))
$$;

-- name: subscription_delivery_before
-- A subscription event, whole, in one statement: dedupe and store it, apply the ordering rule to the
-- subscription, link the customer, decide the account's tier and status from all its
-- subscriptions, and bring the account's plan limits in line (audit rows). In autocommit this is
-- the whole delivery, one round trip and one commit.
--
-- The account is %(account_id)s, and every part that reads or writes an account table names it, so
-- on Citus the account's part runs on the account's shard (the billing tables are reference
-- tables). Who picks it (service/billing/inbox.py): the first id the event names, when the event
-- names one (the common case), with %(resolved)s false: if that account exists, it is the one
-- billing_account would pick (named ids come first), and this one statement is the delivery; if it
-- does not, the statement writes nothing and answers `unresolved`. Otherwise billing_account picks
-- it first and the statement runs with %(resolved)s true (NULL: unmatched, the event is stored so).
--
-- `gate`: the account's row lock, taken only if the row is as this statement's snapshot read it
--   (billing_version, tier, status; the lock re-checks that on the newest row version). Every
--   transaction that changes an account's subscriptions bumps billing_version, so a passed gate
--   means the snapshot holds every subscription of the account, and `best` may read them. A failed
--   gate (or a copy stored meanwhile, or a subscription moving from another account) raises
--   serialization_failure through billing_take_locked_path: all of it rolls back and the caller
--   takes the locked path, which locks the account (account_lock) before this statement runs
--   again in the same transaction (%(locked)s true: moves allowed, the caller recomputes the old
--   owner). %(store)s false (a replay): the inbox row exists; the statement only says the outcome.
-- `up`: the ordering rule (billing_event_wins, migrations/repeatable/billing_rules.sql), under the
--   subscription's row lock. `status` NULL keeps the stored status; a status that keeps access
--   with an end that has passed is stored `expired` (billing_effective_status). `prior_account_id`
--   takes the replaced row's owner; `opened`: the subscription is new.
-- `temporary_end`: a RevenueCat event about a real purchase (%(supersedes_temporary)s) ends the
--   account's temporary entitlement grants, which stood in for it; `best` leaves them out.
-- `best`: the account's deciding subscription after this change (billing_deciding_subscription;
--   the CTE's own write is not visible to the other parts of the statement, so `up` stands in for
--   its stored row).
-- `acct_set`: tier and status from `best`, and the version bump, always (the subscription changed).
-- `limits_set`: when tier or status changed, the account's plan limits follow (quotas_follow_plan,
--   as accounts.apply_plan does), from the plan table passed in (PlanConfig.limit_table). A function
--   called only then, so that the executor does not start the quota and audit writes for the many
--   deliveries that change nothing (migrations/0006). Referenced by the final SELECT, which is what
--   makes it run.
WITH stored AS (
    SELECT FROM webhook_events
     WHERE %(store)s AND provider = %(provider)s AND event_id = %(event_id)s
), acct AS (
    SELECT a.id, a.plan, a.subscription_status, a.billing_version
      FROM accounts a
     WHERE a.id = %(account_id)s
), gate AS (
    SELECT a.id
      FROM acct
      JOIN accounts a ON a.id = acct.id AND a.billing_version = acct.billing_version
                     AND a.plan = acct.plan AND a.subscription_status = acct.subscription_status
     WHERE a.id = %(account_id)s AND NOT EXISTS (SELECT FROM stored)
       FOR NO KEY UPDATE OF a
), up AS (
    INSERT INTO subscriptions AS s (provider, subscription_id, account_id, plan, status, final,
                                    event_at, event_id, expires_at)
    SELECT %(provider)s, %(subscription_id)s, gate.id, %(plan)s,
           billing_effective_status(coalesce(%(status)s, %(status_if_new)s), %(expires_at)s, now()),
           %(final)s, %(occurred_at)s, %(event_id)s, %(expires_at)s
      FROM gate
    ON CONFLICT (provider, subscription_id) DO UPDATE
       SET prior_account_id = s.account_id,
           account_id = EXCLUDED.account_id,
           plan = coalesce(EXCLUDED.plan, s.plan),
           status = billing_effective_status(coalesce(%(status)s, s.status), EXCLUDED.expires_at, now()),
           final = EXCLUDED.final,
           event_at = EXCLUDED.event_at,
           event_id = EXCLUDED.event_id,
           expires_at = EXCLUDED.expires_at,
           updated_at = now()
     WHERE billing_event_wins_before(s.final, s.event_at, s.status, s.event_id, EXCLUDED.final,
                              EXCLUDED.event_at, coalesce(%(status)s, s.status), EXCLUDED.event_id,
                              %(opens)s)
    RETURNING subscription_id, account_id, prior_account_id, plan, status, event_at,
              xmax = 0 AS opened
), temporary_end AS (
    UPDATE subscriptions t
       SET status = 'expired', expires_at = least(t.expires_at, now()), updated_at = now()
     WHERE %(supersedes_temporary)s AND t.account_id = (SELECT account_id FROM up)
       AND t.provider = %(provider)s AND t.subscription_id LIKE 'temporary:%%'
       AND t.subscription_id <> %(subscription_id)s AND t.status <> 'expired'
), linked AS (
    SELECT account_id FROM customer_links
     WHERE provider = %(provider)s AND customer_id = %(link_customer_id)s
), link AS (
    INSERT INTO customer_links (provider, customer_id, account_id, event_id)
    SELECT %(provider)s, %(link_customer_id)s, up.account_id, %(event_id)s
      FROM up
     WHERE %(link_customer_id)s::text IS NOT NULL AND NOT EXISTS (SELECT FROM linked)
    ON CONFLICT (provider, customer_id) DO NOTHING
), best AS (
    SELECT b.plan, b.status
      FROM up, billing_deciding_subscription_before(up.account_id, %(provider)s, up.subscription_id, up.plan,
                                             up.status, up.event_at, %(supersedes_temporary)s) b
), decided AS (
    SELECT acct.id, coalesce(best.plan, acct.plan) AS plan, best.status,
           (coalesce(best.plan, acct.plan), best.status)
               IS DISTINCT FROM (acct.plan, acct.subscription_status) AS changed,
           billing_is_lapsed(coalesce(best.plan, acct.plan), best.status, %(free_plan)s) AS lapsed
      FROM acct, up, best
), acct_set AS (
    UPDATE accounts a
       SET plan = d.plan, subscription_status = d.status, billing_version = a.billing_version + 1,
           updated_at = CASE WHEN d.changed THEN now() ELSE a.updated_at END
      FROM decided d
     WHERE a.id = %(account_id)s AND a.id = d.id
    RETURNING a.id
), limits_set AS (
    SELECT quotas_follow_plan(%(account_id)s, d.plan, d.lapsed, %(actor)s, %(free_plan)s, %(plan_names)s::text[],
                              %(plan_metrics)s::text[], %(plan_limits)s::bigint[]) AS changes
      FROM decided d, acct_set
     WHERE d.changed
), facts AS (
    SELECT acct.id AS account_id, up.subscription_id IS NOT NULL AS applied, up.opened,
           up.prior_account_id AS prior, linked.account_id AS linked_to,
           EXISTS (SELECT FROM stored) AS stored, EXISTS (SELECT FROM gate) AS gated
      FROM (SELECT) one
      LEFT JOIN acct ON true LEFT JOIN up ON true LEFT JOIN linked ON true
), outcome AS (
    SELECT f.*,
           CASE WHEN f.account_id IS NULL AND NOT %(resolved)s THEN 'unresolved'
                WHEN f.account_id IS NULL THEN 'unmatched' WHEN f.applied THEN 'applied'
                ELSE 'ignored' END AS status,
           CASE WHEN f.account_id IS NULL THEN %(unmatched_note)s
                WHEN f.applied THEN nullif(concat_ws('; ', %(note)s::text,
                    'customer ' || quote_literal(%(link_customer_id)s) || ' stays linked to account '
                    || quote_literal(nullif(f.linked_to, f.account_id))), '')
                ELSE (SELECT CASE WHEN cur.final AND cur.event_at <= %(occurred_at)s
                                  THEN 'subscription ended (' || cur.status || ') for good; a later '
                                       'event does not reopen it'
                                  ELSE 'older than the stored state (' || cur.status || ' from '
                                       || cur.event_id || ' at ' || cur.event_at || '); not applied' END
                        FROM subscriptions cur
                       WHERE cur.provider = %(provider)s AND cur.subscription_id = %(subscription_id)s)
           END AS note
      FROM facts f
), ins AS (
    INSERT INTO webhook_events (provider, event_id, type, occurred_at, status, note, account_id,
                                subscription_id, customer_id, named_accounts, payload, processed_at)
    SELECT %(provider)s, %(event_id)s, %(type)s, %(occurred_at)s, o.status, o.note, o.account_id,
           %(subscription_id)s, %(customer_id)s,
           CASE WHEN o.status = 'unmatched' THEN %(account_ids)s::text[] END, %(payload)s::json, now()
      FROM outcome o
     WHERE %(store)s AND o.status <> 'unresolved'
    ON CONFLICT (provider, event_id) DO NOTHING
    RETURNING id
)
SELECT ins.id AS inbox_id, o.status, o.note, o.account_id,
       CASE WHEN o.prior <> o.account_id THEN o.prior END AS moved_from,
       CASE WHEN o.account_id IS NOT NULL AND NOT o.gated AND NOT o.stored
            THEN billing_take_locked_path('the account changed since this statement began')
            WHEN %(store)s AND o.applied AND ins.id IS NULL
            THEN billing_take_locked_path('a copy of this event was stored meanwhile')
            WHEN NOT %(locked)s AND o.prior <> o.account_id
            THEN billing_take_locked_path('the subscription moves from another account')
       END AS gave_way,
       (SELECT changes FROM limits_set) AS limit_changes,
       -- Stored events that this one may have made applicable (inbox.apply_waiting): looked for
       -- only when this event opened a subscription or linked a customer, which is rare.
       CASE WHEN o.opened OR (%(link_customer_id)s::text IS NOT NULL AND o.linked_to IS NULL
                              AND o.applied)
            THEN EXISTS (SELECT FROM webhook_events w
                          WHERE w.status = 'unmatched' AND w.provider = %(provider)s
                            AND (w.subscription_id = %(subscription_id)s
                                 OR w.customer_id = %(link_customer_id)s
                                 OR w.named_accounts && %(account_ids)s::text[]))
            ELSE false END AS waiting
  FROM outcome o LEFT JOIN ins ON true
