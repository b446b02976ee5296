-- Credits: grants of units on top of the plan (service/quota/grants.py). Keyed by account_id, but
-- the void's lookup of a grant named by its id alone (grant_account). The writers are definer
-- functions (migrations/repeatable/grants.sql).

-- name: grant_create
SELECT created, grant_id
  FROM grant_create(%(account_id)s::text, %(metric)s::text, %(units)s::bigint, %(expires_at)s::timestamptz,
                    %(source)s::text, %(source_ref)s::text, %(note)s::text, %(actor)s::text, NULL::text)

-- name: grant_void
SELECT voided, used, changed
  FROM grant_void(%(account_id)s::text, %(grant_id)s::bigint, %(units)s::bigint, %(actor)s::text)

-- name: grant_account
-- The account of a grant named by its id alone (the void route): on Citus it asks every shard.
SELECT account_id FROM grants WHERE id = %(grant_id)s

-- name: grants_of_account
-- An account's grants, newest first, each with what is left of it now (0 once it ended) and its
-- status: live, used (nothing left), expired (past its time, whether or not the expiry job has
-- written its row yet) or voided.
SELECT g.id AS grant_id, g.account_id, g.metric, g.units,
       CASE WHEN s.status = 'live' THEN g.remaining ELSE 0 END AS remaining,
       g.expires_at, g.source, g.source_ref, g.note, g.created_at, g.voided_at, s.status
  FROM grants g,
       LATERAL (SELECT CASE WHEN g.voided_at IS NOT NULL THEN 'voided'
                            WHEN g.expired IS NOT NULL OR g.expires_at <= now() THEN 'expired'
                            WHEN g.remaining = 0 THEN 'used'
                            ELSE 'live' END AS status) AS s
 WHERE g.account_id = %(account_id)s AND (%(metric)s::text IS NULL OR g.metric = %(metric)s)
   AND (%(grant_id)s::bigint IS NULL OR g.id = %(grant_id)s)
 ORDER BY g.created_at DESC, g.id DESC

-- name: grant_credits
-- Each metric's credits: what the account's live grants have left (a take's draw order's grants).
-- live_grants (migrations/repeatable/grants.sql) is the rule; a metric with none is left out.
SELECT lg.metric, sum(lg.remaining)::bigint AS credits
  FROM live_grants lg
 WHERE lg.account_id = %(account_id)s
 GROUP BY lg.metric

-- name: grants_due
-- Grants past their time whose expiry row is not written yet, a batch for the expiry job, by the
-- grants_to_expire index. Each is then expired in its own account's call (grant_expire).
SELECT account_id, id AS grant_id
  FROM grants
 WHERE expires_at <= now() AND expired IS NULL AND voided_at IS NULL
 ORDER BY expires_at
 LIMIT %(limit)s

-- name: grant_expire
SELECT grant_expire(%(account_id)s::text, %(grant_id)s::bigint, %(actor)s::text) AS expired
