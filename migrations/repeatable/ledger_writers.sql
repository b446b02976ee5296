-- The writers of the ledger and of the counters' chain heads (docs/design/ledger-writers.md).
-- `quota-ledger migrate` applies this file on every run (CREATE OR REPLACE), after the versioned
-- migrations, which take from the service's role (quota_app) every other way to write these rows
-- (migrations/0016; the grants at the end of this file): INSERT on ledger and audit_log, and UPDATE
-- of quotas.
--
-- Each writer is a SECURITY DEFINER function owned by the tables' owner (the role `migrate` runs as),
-- with search_path fixed so that a caller cannot redirect its names (pg_temp last: a caller's
-- temporary table never shadows ours). Its body is the one statement the service ran before,
-- unchanged, in PL/pgSQL, which keeps its plan for the session as a prepared statement would
-- (a SECURITY DEFINER SQL function is never inlined and is planned again on every call).
--
-- ledger_link is the chain append, written once: every writer sets a counter's chain head with it,
-- in the UPDATE that moves the counter, and inserts the ledger row from what that UPDATE returns.

-- The next link of a counter's chain: position head_seq + 1, after the row whose hash is head_hash, with a
-- new ledger id and time. Called as `(chain_seq, chain_prev, chain_id, chain_at, chain_hash) =
-- (SELECT * FROM ledger_link(...))` in the SET of the UPDATE that holds the counter's row lock:
-- Postgres evaluates SET again on the newest row version after a lock wait, so the link follows the
-- head whatever the concurrency (migrations/0015). Declared STABLE although it draws from
-- ledger_id_seq so that the planner inlines it into that SET, where the draw is as volatile as it
-- was when written out (a VOLATILE set-returning SQL function is never inlined). Only the writers
-- below call it; EXECUTE is the owner's alone.
CREATE OR REPLACE FUNCTION ledger_link(
    head_seq bigint, head_hash bytea, account_id text, metric text, period text, kind text, units bigint,
    used_after bigint, lim bigint, take_id bigint, idempotency_key text, actor text
) RETURNS TABLE (seq bigint, prev_hash bytea, id bigint, at timestamptz, hash bytea)
LANGUAGE sql STABLE AS $$
    SELECT head_seq + 1, head_hash, e.id, e.at,
           ledger_hash(head_hash, e.id, e.at, account_id, metric, period, kind, units, used_after, lim, take_id,
                       idempotency_key, actor)
      FROM (SELECT nextval('ledger_id_seq') AS id, clock_timestamp() AS at) AS e
$$;

-- The link that opens p_period on a counter (the lazy rollover and the monthly reset): a `reset`
-- row that clears what the counter held, keyed `period-open:<period>` (the unique index
-- ledger_one_period_open refuses a second). Inlined into the caller's SET as ledger_link is.
CREATE OR REPLACE FUNCTION ledger_open_link(
    head_seq bigint, head_hash bytea, account_id text, metric text, period text, cleared bigint, actor text
) RETURNS TABLE (seq bigint, prev_hash bytea, id bigint, at timestamptz, hash bytea)
LANGUAGE sql STABLE AS $$
    SELECT * FROM ledger_link(head_seq, head_hash, account_id, metric, period, 'reset', cleared, 0, NULL, NULL,
                              'period-open:' || period, actor)
$$;

-- The take (service/quota/takes.sql `take`), one statement: the conditional UPDATE re-checks
-- `used + units <= lim` on the latest row version under READ COMMITTED, so concurrent takes neither
-- overshoot nor lose an update, and the ledger row is written by the same statement. A duplicate
-- idempotency key makes the INSERT raise a unique violation, which aborts the whole statement,
-- counter update included. No row back: refused, and the caller asks why. A take that brings the
-- counter to its alert line (quotas.alert_pct, migrations/0027) then calls quota_alert, which writes
-- its threshold events in this transaction (migrations/repeatable/events_out.sql); any other take
-- pays one comparison for that (bench/README.md, "Events out").
CREATE OR REPLACE FUNCTION ledger_take(
    p_account_id text, p_metric text, p_units bigint, p_period text, p_idempotency_key text, p_actor text
) RETURNS TABLE (take_id bigint, metric text, units bigint, used bigint, "limit" bigint, period text,
                 limit_source text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $f$
#variable_conflict use_column
DECLARE
    v_alert boolean;  -- the take reached the counter's alert line (quota_alert, events_out.sql)
BEGIN
WITH granted AS (
    UPDATE quotas q
       SET used = q.used + p_units,
           (chain_seq, chain_prev, chain_id, chain_at, chain_hash) = (
               SELECT * FROM ledger_link(q.chain_seq, q.chain_hash, q.account_id, q.metric, q.period, 'take',
                                         p_units, q.used + p_units, q.lim, NULL, p_idempotency_key, p_actor))
     WHERE q.account_id = p_account_id AND q.metric = p_metric AND q.period = p_period
       AND NOT q.account_deleted
       AND (q.lim IS NULL OR q.used + p_units <= q.lim)
 RETURNING q.account_id, q.metric, q.period, q.used, q.lim, q.limit_source, q.chain_id, q.chain_at, q.chain_seq,
           q.chain_prev, q.chain_hash, threshold_reached(q.used, q.lim, q.alert_pct) AS alert
), entry AS (
    INSERT INTO ledger (id, at, seq, account_id, metric, period, kind, units, used_after, lim, limit_source,
                        idempotency_key, actor, prev_hash, hash)
    OVERRIDING SYSTEM VALUE
    SELECT g.chain_id, g.chain_at, g.chain_seq, g.account_id, g.metric, g.period, 'take', p_units, g.used, g.lim,
           g.limit_source, p_idempotency_key, p_actor, g.chain_prev, g.chain_hash
      FROM granted g
)  -- runs to completion whether read or not; the answer is the granted row it inserted
SELECT g.chain_id, g.metric, p_units, g.used::bigint, g.lim, g.period, g.limit_source, g.alert
  INTO take_id, metric, units, used, "limit", period, limit_source, v_alert
  FROM granted g;
IF NOT FOUND THEN
    RETURN;
END IF;
IF v_alert THEN
    PERFORM quota_alert(p_account_id, p_metric);
END IF;
RETURN NEXT;
END
$f$;


-- The idempotency key of line p_line (1-based, in metric order) of a multi-line take keyed p_key:
-- the first line's row holds the client's key itself, so that a single take and a multi-line take
-- share one namespace (the unique index ledger_take_key refuses a second use of the key whatever
-- its form); line n >= 2 holds the key, U+001F and n, which no client key contains (the API refuses
-- U+001F in a key: service/http/schemas/fields.py). A take of one line is keyed as a single take.
-- One key thus names the N rows of one multi-line take, and the single take's statement is unchanged.
CREATE OR REPLACE FUNCTION take_line_key(p_key text, p_line integer) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_line = 1 THEN p_key ELSE p_key || chr(31) || p_line END
$$;

-- Every key take_line_key may give p_key, in line order (a multi-line take has at most 20 lines:
-- service/quota/takes.py MAX_LINES): what a replay of the key looks up (takes.sql `takes_by_key`).
CREATE OR REPLACE FUNCTION take_line_keys(p_key text) RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT array_agg(take_line_key(p_key, n) ORDER BY n) FROM generate_series(1, 20) AS n
$$;

-- A multi-line take (takes.sql `take_lines`): one statement that grants every line or none.
-- p_metrics, p_units and p_periods are the lines, one element each, distinct metrics. `locked` locks
-- the account's counters of those metrics in metric order (LockRows sits above the sort), whatever
-- the order of the request, so two multi-line takes of one account never wait on each other in a
-- cycle (a single take locks one row; the reset groups lock in (account, metric) order too); it
-- reads each row's newest version, as a take's UPDATE re-checks it. `fits` is true only when every
-- line's counter is there, in the line's period, not deleted and with room for it; the UPDATE then
-- moves each counter and links its ledger row through ledger_link exactly as ledger_take does (the
-- SET is evaluated on the row this statement holds locked), and the INSERT writes the rows, keyed by
-- take_line_key. Else nothing changes and no row comes back; the caller asks each line why. A key
-- already used makes the INSERT raise a unique violation, which undoes the whole statement. Every
-- step names the account, so Citus routes it to the account's shard.
CREATE OR REPLACE FUNCTION ledger_take_lines(
    p_account_id text, p_metrics text[], p_units bigint[], p_periods text[], p_idempotency_key text,
    p_actor text
) RETURNS TABLE (take_id bigint, metric text, units bigint, used bigint, "limit" bigint, period text,
                 limit_source text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $f$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH line AS MATERIALIZED (
    SELECT l.metric, l.units, l.period, l.request_order,
           row_number() OVER (ORDER BY l.metric COLLATE "C") AS line_no
      FROM unnest(p_metrics, p_units, p_periods) WITH ORDINALITY AS l(metric, units, period, request_order)
), locked AS MATERIALIZED (
    SELECT q.metric, q.period, q.used, q.lim, q.account_deleted
      FROM quotas q
     WHERE q.account_id = p_account_id AND q.metric = ANY(p_metrics)
     ORDER BY q.metric COLLATE "C"
       FOR NO KEY UPDATE
), fits AS MATERIALIZED (
    SELECT count(*) = cardinality(p_metrics) AS every_line
      FROM locked k JOIN line l ON l.metric = k.metric
     WHERE k.period = l.period AND NOT k.account_deleted AND (k.lim IS NULL OR k.used + l.units <= k.lim)
), granted AS (
    UPDATE quotas q
       SET used = q.used + l.units,
           (chain_seq, chain_prev, chain_id, chain_at, chain_hash) = (
               SELECT * FROM ledger_link(q.chain_seq, q.chain_hash, q.account_id, q.metric, q.period, 'take',
                                         l.units, q.used + l.units, q.lim, NULL,
                                         take_line_key(p_idempotency_key, l.line_no::integer), p_actor))
      FROM line l, fits f
     WHERE q.account_id = p_account_id AND q.metric = l.metric AND q.period = l.period AND f.every_line
 RETURNING q.account_id, q.metric, q.period, q.used, q.lim, q.limit_source, q.chain_id, q.chain_at, q.chain_seq,
           q.chain_prev, q.chain_hash, l.units, l.line_no, l.request_order
), entry AS (
    INSERT INTO ledger (id, at, seq, account_id, metric, period, kind, units, used_after, lim, limit_source,
                        idempotency_key, actor, prev_hash, hash)
    OVERRIDING SYSTEM VALUE
    SELECT g.chain_id, g.chain_at, g.chain_seq, g.account_id, g.metric, g.period, 'take', g.units, g.used, g.lim,
           g.limit_source, take_line_key(p_idempotency_key, g.line_no::integer), p_actor, g.chain_prev,
           g.chain_hash
      FROM granted g
 RETURNING ledger.id, ledger.metric
)
SELECT e.id, g.metric, g.units::bigint, g.used::bigint, g.lim, g.period::text, g.limit_source
  FROM entry e JOIN granted g ON g.metric = e.metric
 ORDER BY g.request_order;
IF FOUND THEN
    PERFORM quota_alerts(p_account_id, p_metrics);
END IF;
END
$f$;

-- A batch of independent takes (takes.py take_each, POST /v1/takes/batch) in one statement and one
-- transaction. Each item is taken by ledger_take exactly as a single take is, in (account, metric)
-- order, the order the resets lock counters in, so a batch never waits in a cycle with another batch,
-- a multi-line take (one account's counters in metric order) or a reset; the items of one counter go
-- in item order, so each answer is the one the same takes made one after another would get. An item
-- refused reads the counter it met, as takes.sql `take_refusal` does (`deleted` NULL: no such
-- account; `credits`: the live grants' remaining when the allowance has no room, for the caller's
-- take with credits); an item whose idempotency key is in the ledger already is not taken (`key_met`), and the
-- caller replays it as a single take's refusal does. One commit for the batch instead of one per item
-- is what makes a batch cheaper than its takes one by one (bench/README.md, "Takes in bulk"). A key
-- used concurrently between the look-up and the INSERT raises a unique violation, which undoes the
-- whole batch: the caller then takes the items one by one. Not used on Citus, where one transaction
-- must stay on one account's shard.
CREATE OR REPLACE FUNCTION ledger_take_each(
    p_account_ids text[], p_metrics text[], p_units bigint[], p_periods text[], p_keys text[], p_actor text
) RETURNS TABLE (item integer, granted boolean, key_met boolean, take_id bigint, used bigint, "limit" bigint,
                 counter_period text, limit_source text, deleted boolean, credits bigint)
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $f$
DECLARE
    x record;
BEGIN
    FOR x IN SELECT t.account_id, t.metric, t.units, t.period, t.key, t.n::integer AS n
               FROM unnest(p_account_ids, p_metrics, p_units, p_periods, p_keys) WITH ORDINALITY
                    AS t (account_id, metric, units, period, key, n)
              ORDER BY t.account_id, t.metric, t.n
    LOOP
        item := x.n;
        granted := false;
        deleted := NULL;
        credits := 0;
        key_met := x.key IS NOT NULL
                   AND EXISTS (SELECT FROM ledger l WHERE l.account_id = x.account_id AND l.idempotency_key = x.key);
        IF key_met THEN
            take_id := NULL; used := NULL; "limit" := NULL; counter_period := NULL; limit_source := NULL;
        ELSE
            SELECT t.take_id, t.used, t."limit", t.period, t.limit_source
              INTO take_id, used, "limit", counter_period, limit_source
              FROM ledger_take(x.account_id, x.metric, x.units, x.period, x.key, p_actor) AS t;
            granted := FOUND;
            IF NOT granted THEN  -- no row: every field NULL, no such account
                SELECT a.deleted, q.used, q.lim, q.period, q.limit_source,
                       CASE WHEN q.used + x.units > q.lim THEN grant_credits(a.id, x.metric) ELSE 0 END
                  INTO deleted, used, "limit", counter_period, limit_source, credits
                  FROM accounts a
                  LEFT JOIN quotas q ON q.account_id = a.id AND q.metric = x.metric
                 WHERE a.id = x.account_id;
            END IF;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$f$;

-- The lazy rollover of one counter into p_period (takes.sql `roll_over`), and the ledger row that
-- records what it cleared: from an earlier period of the same kind, or from a period of another kind
-- (month, day, held: service/quota/periods.py) when the metric's kind changed in the plan config
-- (the caller decides when that may clear usage). FOR UPDATE reads the latest row version (and skips
-- it if another statement rolled it over first), so `prior.used` is exactly what this statement clears. A counter
-- that held nothing needs no reset row, so its chain does not move. The unique index on period-open
-- keys makes a second opening impossible.
CREATE OR REPLACE FUNCTION ledger_roll_over(p_account_id text, p_metric text, p_period text, p_actor text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $f$
#variable_conflict use_column
BEGIN
WITH prior AS (
    SELECT q.account_id, q.metric, q.used
      FROM quotas q
     WHERE q.account_id = p_account_id AND q.metric = p_metric AND q.period <> p_period
       AND (q.period < p_period OR char_length(q.period) <> char_length(p_period))
       FOR UPDATE
), opened AS (
    UPDATE quotas q
       SET used = 0, period = p_period, alerted = 0, alert_pct = 1,
           (chain_seq, chain_prev, chain_id, chain_at, chain_hash) = (
               SELECT * FROM ledger_open_link(q.chain_seq, q.chain_hash, q.account_id, q.metric, p_period,
                                              prior.used, p_actor))
      FROM prior
     WHERE q.account_id = p_account_id AND q.account_id = prior.account_id AND q.metric = prior.metric
       AND prior.used > 0
 RETURNING q.account_id, q.metric, prior.used AS cleared, q.chain_id, q.chain_at, q.chain_seq, q.chain_prev,
           q.chain_hash
), emptied AS (
    UPDATE quotas q
       SET period = p_period, alerted = 0, alert_pct = 1
      FROM prior
     WHERE q.account_id = p_account_id AND q.account_id = prior.account_id AND q.metric = prior.metric
       AND prior.used = 0
)
INSERT INTO ledger (id, at, seq, account_id, metric, period, kind, units, used_after, idempotency_key, actor,
                    prev_hash, hash)
OVERRIDING SYSTEM VALUE
SELECT o.chain_id, o.chain_at, o.chain_seq, o.account_id, o.metric, p_period, 'reset', o.cleared, 0,
       'period-open:' || p_period, p_actor, o.chain_prev, o.chain_hash
  FROM opened o;
END
$f$;

-- Gives a take's units back, once, in the take's own period only, never below zero (takes.sql
-- `release`). p_period is the day of the release (or a month): a take counts in that day, that
-- month, or `held` (an allocation's take, which may be given back at any later time). The counter row is locked first so `held.used` is current; a concurrent second release
-- of the same take fails on the unique index (one release per take), which aborts its whole
-- statement. Every table is filtered on the account, so that Citus routes it to one shard.
CREATE OR REPLACE FUNCTION ledger_release(p_account_id text, p_take_id bigint, p_period text, p_actor text)
RETURNS TABLE (released boolean, take_id bigint, account_id text, metric text, units bigint, used bigint,
               "limit" bigint, period text, limit_source text, release_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $f$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH taken AS (
    SELECT t.account_id, t.metric, t.period, t.units, t.id
      FROM ledger t
     WHERE t.account_id = p_account_id AND t.id = p_take_id AND t.kind = 'take'
       AND t.period IN (p_period, left(p_period, 7), 'held')
       AND NOT EXISTS (SELECT 1 FROM ledger r
                        WHERE r.account_id = p_account_id AND r.kind = 'release' AND r.take_id = t.id)
       -- a take that drew on grants (its allowance share filled the counter, and its draws follow it
       -- in the chain) is ledger_release_credits' (migrations/repeatable/grants.sql): not here
       AND NOT (t.lim IS NOT NULL AND t.used_after >= t.lim
                AND EXISTS (SELECT 1 FROM ledger d
                             WHERE d.account_id = p_account_id AND d.metric = t.metric AND d.seq = t.seq + 1
                               AND d.kind = 'grant_take' AND d.take_id = t.id))
), held AS (
    SELECT q.account_id, q.metric, q.used, taken.units, taken.id AS take_id
      FROM quotas q JOIN taken ON q.account_id = taken.account_id AND q.metric = taken.metric
     WHERE q.account_id = p_account_id AND q.period = taken.period
       FOR UPDATE OF q
), given AS (
    -- greatest(..., 0) never changes what is written: `held` locked the newest row version, so there
    -- used >= what is given back. But when the row changed after this statement's snapshot, Postgres
    -- first evaluates SET on the version the snapshot saw, then finds it updated and evaluates again on
    -- the locked one; the quota_units domain check (migrations/0005) runs in that first evaluation,
    -- and a stale `used` below held.used would fail it spuriously (a release racing an admin reset).
    UPDATE quotas q
       SET used = greatest(q.used - least(held.units, held.used), 0),
           (chain_seq, chain_prev, chain_id, chain_at, chain_hash) = (
               SELECT * FROM ledger_link(q.chain_seq, q.chain_hash, q.account_id, q.metric, q.period, 'release',
                                         least(held.units, held.used), q.used - least(held.units, held.used),
                                         NULL, held.take_id, NULL, p_actor))
      FROM held
     WHERE q.account_id = p_account_id AND q.account_id = held.account_id AND q.metric = held.metric
 RETURNING q.account_id, q.metric, q.period, q.used, q.lim, q.limit_source,
           least(held.units, held.used) AS units, held.take_id,
           q.chain_id, q.chain_at, q.chain_seq, q.chain_prev, q.chain_hash
), entry AS (
    INSERT INTO ledger (id, at, seq, account_id, metric, period, kind, units, used_after, take_id, actor,
                        prev_hash, hash)
    OVERRIDING SYSTEM VALUE
    SELECT g.chain_id, g.chain_at, g.chain_seq, g.account_id, g.metric, g.period, 'release', g.units, g.used,
           g.take_id, p_actor, g.chain_prev, g.chain_hash
      FROM given g
 RETURNING ledger.id
)
SELECT true, g.take_id, g.account_id::text, g.metric, g.units::bigint, g.used::bigint, g.lim, g.period::text,
       g.limit_source, (SELECT e.id FROM entry e)
  FROM given g;
END
$f$;

-- An admin's reset of the open period's counter (service/quota/admin.sql `admin_reset`); the ledger
-- row names the admin key and the value cleared. Locked first so `prior.used` is exactly what is
-- cleared. No row back: there was no counter in p_period.
CREATE OR REPLACE FUNCTION ledger_admin_reset(p_account_id text, p_metric text, p_period text, p_actor text)
RETURNS TABLE (id bigint, previous bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $f$
#variable_conflict use_column
DECLARE
    r record;
BEGIN
-- The audit row is written here, by the same user as the reset: on Citus a transaction may not
-- write a node's placements as two users (docs/design/ledger-writers.md).
FOR r IN
WITH prior AS (
    SELECT q.account_id, q.metric, q.used
      FROM quotas q
     WHERE q.account_id = p_account_id AND q.metric = p_metric AND q.period = p_period
       FOR UPDATE
), cleared AS (
    UPDATE quotas q
       SET used = 0,
           (chain_seq, chain_prev, chain_id, chain_at, chain_hash) = (
               SELECT * FROM ledger_link(q.chain_seq, q.chain_hash, q.account_id, q.metric, p_period, 'reset',
                                         prior.used, 0, NULL, NULL, NULL, p_actor))
      FROM prior
     WHERE q.account_id = p_account_id AND q.account_id = prior.account_id AND q.metric = prior.metric
 RETURNING q.account_id, q.metric, prior.used AS previous, q.chain_id, q.chain_at, q.chain_seq, q.chain_prev,
           q.chain_hash
)
INSERT INTO ledger (id, at, seq, account_id, metric, period, kind, units, used_after, actor, prev_hash, hash)
OVERRIDING SYSTEM VALUE
SELECT c.chain_id, c.chain_at, c.chain_seq, c.account_id, c.metric, p_period, 'reset', c.previous, 0, p_actor,
       c.chain_prev, c.chain_hash
  FROM cleared c
RETURNING ledger.id, ledger.units
LOOP
    id := r.id; previous := r.units;
    RETURN NEXT;
END LOOP;
INSERT INTO audit_log (actor, action, account_id, metric, old, new)
VALUES (p_actor, 'counter_reset', p_account_id, p_metric,
        jsonb_build_object('used', coalesce(previous, 0), 'period', p_period),
        jsonb_build_object('used', 0, 'period', p_period, 'ledger_id', id));
END
$f$;

-- Opens p_period (a month, or a day) for one group of the monthly or daily reset
-- (service/quota/reset.sql `reset_pick` and `reset_group`): the counters of these accounts (all on
-- one shard) from the group's first to its last counter in index order that are still in an earlier
-- period of the same kind (the same length: a month's counters are never opened into a day). The same steps as
-- ledger_roll_over, over many rows. FOR UPDATE reads each row's latest version; a counter that a
-- take rolled over meanwhile no longer matches `period < P` on the re-check and drops out, so usage
-- taken in the new period is never zeroed and no counter is opened twice. Rows are locked in key
-- order, as quota_set_plan_limits_batch locks them, so the two never deadlock. A counter that held
-- nothing gets its period advanced without a ledger row. Soft-deleted accounts are left alone. Every step
-- names the accounts, so Citus routes each to the group's shard (tests/citus/test_cluster.py).
CREATE OR REPLACE FUNCTION ledger_reset_group(
    p_account_ids text[], p_first_period text, p_first_account text, p_first_metric text,
    p_last_period text, p_last_account text, p_last_metric text, p_period text, p_actor text
) RETURNS TABLE (counters bigint, reset_rows bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $f$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH batch AS (
    SELECT q.account_id, q.metric, q.used
      FROM quotas q
     WHERE q.account_id = ANY(p_account_ids)
       AND (q.period, q.account_id, q.metric) >= (p_first_period, p_first_account, p_first_metric)
       AND (q.period, q.account_id, q.metric) <= (p_last_period, p_last_account, p_last_metric)
       AND q.period < p_period AND char_length(q.period) = char_length(p_period) AND NOT q.account_deleted
     ORDER BY q.account_id, q.metric
       FOR UPDATE
), opened AS (
    UPDATE quotas q
       SET used = 0, period = p_period, alerted = 0, alert_pct = 1,
           (chain_seq, chain_prev, chain_id, chain_at, chain_hash) = (
               SELECT * FROM ledger_open_link(q.chain_seq, q.chain_hash, q.account_id, q.metric, p_period, b.used,
                                              p_actor))
      FROM batch b
     WHERE q.account_id = ANY(p_account_ids)
       AND q.account_id = b.account_id AND q.metric = b.metric AND b.used > 0
 RETURNING q.account_id, q.metric, b.used AS cleared, q.chain_id, q.chain_at, q.chain_seq, q.chain_prev,
           q.chain_hash
), emptied AS (  -- held nothing: the period moves on, no ledger row, the chain stays where it is
    UPDATE quotas q
       SET period = p_period, alerted = 0, alert_pct = 1
      FROM batch b
     WHERE q.account_id = ANY(p_account_ids)
       AND q.account_id = b.account_id AND q.metric = b.metric AND b.used = 0
 RETURNING 1
), entries AS (
    INSERT INTO ledger (id, at, seq, account_id, metric, period, kind, units, used_after, idempotency_key, actor,
                        prev_hash, hash)
    OVERRIDING SYSTEM VALUE
    SELECT o.chain_id, o.chain_at, o.chain_seq, o.account_id, o.metric, p_period, 'reset', o.cleared, 0,
           'period-open:' || p_period, p_actor, o.chain_prev, o.chain_hash
      FROM opened o
 RETURNING 1
)
SELECT (SELECT count(*) FROM opened) + (SELECT count(*) FROM emptied), (SELECT count(*) FROM entries);
END
$f$;

-- One audit row, stamped with the database's clock and id. The owner's alone: the service's role
-- writes audit rows only through the definer functions that make the change they record, in the
-- same call (quota_set_override, account_set_deleted, ledger_admin_reset, quota_set_plan_limits,
-- audit_event_replayed), so on Citus one user writes the account's node (docs/design/
-- ledger-writers.md); `quota-ledger keys` runs as the owner and calls it for its own rows.
CREATE OR REPLACE FUNCTION audit_append(
    p_actor text, p_action text, p_account_id text, p_metric text, p_old jsonb, p_new jsonb
) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, public, pg_temp AS $$
    INSERT INTO audit_log (actor, action, account_id, metric, old, new)
    VALUES (p_actor, p_action, p_account_id, p_metric, p_old, p_new)
$$;

-- A sticky override set (p_set) or cleared, and its audit row (`override_set`, `override_cleared`,
-- old and new as {limit} or null), in one call (service/quota/overrides.py). The counter's row is
-- locked first, so of concurrent calls that would change the same thing, one does and the others
-- find it done: a call that changes nothing writes nothing. Returns the previous override; no row
-- back: the account has no counter of p_metric.
CREATE OR REPLACE FUNCTION quota_set_override(
    p_account_id text, p_metric text, p_set boolean, p_limit bigint, p_actor text
) RETURNS TABLE (override_set boolean, override_limit bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $f$
#variable_conflict use_column
DECLARE
    v_old jsonb;
    v_new jsonb := CASE WHEN p_set THEN jsonb_build_object('limit', p_limit) ELSE 'null' END;
BEGIN
    SELECT q.override_set, q.override_limit INTO override_set, override_limit
      FROM quotas q
     WHERE q.account_id = p_account_id AND q.metric = p_metric
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN NEXT;
    v_old := CASE WHEN override_set THEN jsonb_build_object('limit', override_limit) ELSE 'null' END;
    IF v_old = v_new THEN
        RETURN;
    END IF;
    UPDATE quotas q
       SET override_set = p_set, override_limit = CASE WHEN p_set THEN p_limit END
     WHERE q.account_id = p_account_id AND q.metric = p_metric;
    PERFORM audit_append(p_actor, CASE WHEN p_set THEN 'override_set' ELSE 'override_cleared' END,
                         p_account_id, p_metric, v_old, v_new);
END
$f$;

-- A soft delete (p_deleted) or a restore of the account, its counters' copy of the flag (what takes
-- read), and its audit row (`account_deleted`, `account_restored`), in one call
-- (service/quota/admin.py). False, and nothing written, when the account is not there or is as
-- asked already: the audit log records only what changed.
CREATE OR REPLACE FUNCTION account_set_deleted(p_account_id text, p_deleted boolean, p_actor text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $f$
DECLARE
    v_now timestamptz := now();
BEGIN
    UPDATE accounts a SET deleted = p_deleted, updated_at = v_now
     WHERE a.id = p_account_id AND a.deleted <> p_deleted;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE quotas q SET account_deleted = p_deleted WHERE q.account_id = p_account_id;
    PERFORM audit_append(p_actor, CASE WHEN p_deleted THEN 'account_deleted' ELSE 'account_restored' END,
                         p_account_id, NULL, jsonb_build_object('deleted', NOT p_deleted),
                         jsonb_build_object('deleted', p_deleted));
    RETURN true;
END
$f$;

-- The service's role appends no audit row itself, and never changes or deletes one (the
-- append-only triggers and grants of 0001).
REVOKE INSERT ON audit_log FROM quota_app;

-- Who may call what (set_function_grants, migrations/0020): the writers are the service's,
-- ledger_link, ledger_open_link and audit_append the owner's alone.
CALL set_function_grants(
    ARRAY['ledger_take(text, text, bigint, text, text, text)',
          'ledger_take_lines(text, text[], bigint[], text[], text, text)',
          'ledger_take_each(text[], text[], bigint[], text[], text[], text)',
          'take_line_key(text, integer)',
          'take_line_keys(text)',
          'ledger_roll_over(text, text, text, text)',
          'ledger_release(text, bigint, text, text)',
          'ledger_admin_reset(text, text, text, text)',
          'ledger_reset_group(text[], text, text, text, text, text, text, text, text)',
          'quota_set_override(text, text, boolean, bigint, text)',
          'account_set_deleted(text, boolean, text)'],
    ARRAY['ledger_link(bigint, bytea, text, text, text, text, bigint, bigint, bigint, bigint, text, text)',
          'ledger_open_link(bigint, bytea, text, text, text, bigint, text)',
          'audit_append(text, text, text, text, jsonb, jsonb)']);

-- What the service's role still writes of quotas directly (migrations/0016): new counter rows, column
-- by column (ensure_quotas), never an existing row. Limits, override and deletion flag change only in
-- the definer functions that audit the change (quota_set_plan_limits, quota_set_override,
-- account_set_deleted); used, period and chain_* only in the ledger's writers.
-- On Citus the coordinator checks the distributed table's column grants, but the INSERT it sends to
-- a shard names every column that has a default (used, chain_seq, ...), so the shards get INSERT on
-- the whole row (docs/design/ledger-writers.md: what that leaves open). run_command_on_shards uses
-- connections of its own, so it goes first: after the distributed table's grant, which Citus
-- propagates inside this transaction, it would wait for that transaction (a deadlock no one detects).
-- Run `migrate` again after moving shards.
DO $$
DECLARE
    revoke_update constant text := 'REVOKE UPDATE ON %1$s FROM quota_app';
BEGIN
    IF EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') THEN
        IF EXISTS (SELECT FROM run_command_on_shards('quotas',
                                                     revoke_update || '; GRANT INSERT ON %1$s TO quota_app')
                    WHERE NOT success) THEN
            RAISE EXCEPTION 'could not grant quota_app its privileges on every shard of quotas';
        END IF;
    END IF;
    EXECUTE format(revoke_update, 'quotas');
    GRANT INSERT (account_id, metric, plan_limit, free_limit, lapsed, account_deleted, period)
        ON quotas TO quota_app;
END
$$;
