-- The delivery's resolve and apply stages (service/billing/apply.py). Named parameters.

-- name: billing_account
-- The account an event is for, best first: the first of the ids it names that exists (in its
-- order), else the subscription's current owner, else the account the product linked the Stripe
-- customer to (stripe_customers), else the account an earlier event linked the customer to. No row:
-- unmatched. A read without locks, of the billing tables (reference tables on Citus, read on any
-- node) and of accounts by the named ids (the shards of those ids alone), so that the account's
-- part of a delivery can then name its account and run on its shard (README "Scaling out").
SELECT c.account_id
  FROM (SELECT a.id::text AS account_id, array_position(%(account_ids)s::text[], a.id::text) AS rank
          FROM accounts a
         WHERE a.id = ANY (%(account_ids)s::text[])
        UNION ALL
        SELECT s.account_id, 1000 FROM subscriptions s
         WHERE s.provider = %(provider)s AND s.subscription_id = %(subscription_id)s
        UNION ALL
        SELECT k.account_id, 2000 FROM stripe_customers k
         WHERE %(provider)s = 'stripe' AND k.customer_id = %(customer_id)s
        UNION ALL
        SELECT l.account_id, 3000 FROM customer_links l
         WHERE l.provider = %(provider)s AND l.customer_id = %(customer_id)s) c
 ORDER BY c.rank
 LIMIT 1

-- name: account_lock
-- The lock of a billing change on one account (the delivery's locked path, replays, transfers, the
-- expiry job), until commit, with its billing_version bumped: every change to an account's
-- subscriptions holds this lock (billing_deliver takes it first too), so the statements after it
-- see every other change to them. billing_lock_account (migrations/repeatable/billing_rules.sql),
-- as the owner, who then writes the account's tier and limits. By id, so one shard on Citus;
-- several accounts are locked one at a time, in id order (apply.lock_accounts), never by one
-- statement across shards.
SELECT id, plan, subscription_status FROM billing_lock_account(%(account_id)s::text)

-- name: billing_deliver
-- A subscription event, whole, in one statement: billing_deliver (migrations/repeatable/
-- billing_rules.sql) locks the account, then stores and applies the event in statements that each
-- name the account (one shard on Citus). In autocommit this is the whole delivery, one round trip
-- and one commit. Parameters: apply.deliver_params.
SELECT inbox_id, status, note, account_id, moved_from, limit_changes, waiting
  FROM billing_deliver(
           p_account_id => %(account_id)s, p_resolved => %(resolved)s, p_store => %(store)s,
           p_locked => %(locked)s, p_provider => %(provider)s, p_event_id => %(event_id)s,
           p_type => %(type)s, p_occurred_at => %(occurred_at)s, p_payload => %(payload)s,
           p_account_ids => %(account_ids)s::text[], p_subscription_id => %(subscription_id)s,
           p_customer_id => %(customer_id)s, p_plan => %(plan)s, p_status => %(status)s,
           p_status_if_new => %(status_if_new)s, p_final => %(final)s, p_opens => %(opens)s,
           p_expires_at => %(expires_at)s, p_supersedes_temporary => %(supersedes_temporary)s,
           p_note => %(note)s, p_unmatched_note => %(unmatched_note)s, p_actor => %(actor)s,
           p_free_plan => %(free_plan)s, p_plan_names => %(plan_names)s::text[],
           p_plan_metrics => %(plan_metrics)s::text[], p_plan_limits => %(plan_limits)s::bigint[])

-- name: subscriptions_transfer
-- Moves the provider's subscriptions of the source accounts to `account_id`, except those whose
-- stored event is newer than the transfer (that event already says who has them). The transfer
-- becomes their newest event, so an older event naming the source cannot move them back.
UPDATE subscriptions s
   SET prior_account_id = s.account_id, account_id = %(account_id)s,
       event_at = %(event_at)s, event_id = %(event_id)s, updated_at = now()
 WHERE s.provider = %(provider)s AND s.account_id = ANY(%(from_ids)s::text[])
   AND s.account_id <> %(account_id)s AND s.event_at <= %(event_at)s
RETURNING s.subscription_id, s.prior_account_id

-- name: billing_set_tier
-- The locked account follows its deciding subscription (billing_set_tier,
-- migrations/repeatable/billing_rules.sql), given its tier and status as account_lock read them. A
-- statement of its own, a function call with no table: on Citus it runs on the coordinator and its
-- statements, which name the account, on the account's shard.
SELECT billing_set_tier(%(account_id)s, %(plan)s, %(status)s, NULL, false, %(actor)s, %(free_plan)s,
                        %(plan_names)s::text[], %(plan_metrics)s::text[], %(plan_limits)s::bigint[])

-- name: billing_link_customer
-- A customer keeps the first account it was linked to (billing_link_customer): the account it is
-- linked to, and whether this made the link.
SELECT linked_to, created
  FROM billing_link_customer(%(provider)s, %(customer_id)s, %(account_id)s, %(event_id)s)

-- name: credit_grant
-- A credit pack's grant (README "Credits"): quota's writer, grant_create (migrations/repeatable/
-- grants.sql), once per purchase (source, reference): a redelivery finds the first grant. As the
-- owner, in the delivery's transaction, after the account's lock, so that on Citus the account's
-- node is written by one user. No row: the account has no counter of the metric.
SELECT created, grant_id
  FROM grant_create(%(account_id)s::text, %(metric)s::text, %(units)s::bigint, %(expires_at)s::timestamptz,
                    %(provider)s::text, %(reference)s::text, %(note)s::text, %(actor)s::text,
                    %(payment_ref)s::text)

-- name: credit_purchased
-- The grant a purchase made (credit_purchased, migrations/repeatable/billing_rules.sql), as the
-- owner: of any account (`account_id` NULL; on Citus every shard is asked), or of the locked
-- account alone.
SELECT account_id, grant_id, units, voided
  FROM credit_purchased(%(provider)s::text, %(payment_ref)s::text, %(reference)s::text, %(account_id)s::text)

-- name: credit_void
-- A refund's void of a purchased grant, forward-only (quota's grant_void): `units` at most (NULL:
-- all that is left).
SELECT voided, used, changed
  FROM grant_void(%(account_id)s::text, %(grant_id)s::bigint, %(units)s::bigint, %(actor)s::text)
