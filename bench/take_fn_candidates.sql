-- Candidate shapes of the take as a function, for bench/take_fn_ab.py and the Citus evaluation
-- (README "Scaling out", "Delegating the take"). Not used by the service: what it runs on Citus is
-- take_delegated (migrations/repeatable/take_delegated.sql), take_fn_locked with the chain position. Parameters and result as
-- service/quota/takes.sql `take`; a refused take returns one row of NULLs (a function distributed
-- by Citus is delegated only when called as `SELECT * FROM f(constants)`, with no WHERE).
--
-- take_fn_cte: the take statement as it is (UPDATE ... RETURNING in a CTE, INSERT ... SELECT from
-- it), inside PL/pgSQL. On a Citus worker the statement is still planned by Citus, recursively
-- (intermediate results), only locally.
CREATE OR REPLACE FUNCTION take_fn_cte(p_account_id text, p_metric text, p_units bigint, p_period text,
                           p_idempotency_key text, p_actor text,
                           OUT take_id bigint, OUT metric text, OUT units bigint, OUT used bigint, OUT "limit" bigint, OUT period text, OUT limit_source text)
LANGUAGE plpgsql AS $f$
BEGIN
WITH granted AS (
    UPDATE quotas q
       SET used = q.used + p_units, chain_seq = q.chain_seq + 1,
           (chain_prev, chain_id, chain_at, chain_hash) = (
               SELECT q.chain_hash, e.id, e.at,
                      ledger_hash(q.chain_hash, e.id, e.at, q.account_id, q.metric,
                                  q.period, 'take', p_units, q.used + p_units, q.lim,
                                  NULL, p_idempotency_key, p_actor)
                 FROM (SELECT nextval('ledger_id_seq') AS id, clock_timestamp() AS at) AS e)
     WHERE q.account_id = p_account_id AND q.metric = p_metric AND q.period = p_period
       AND NOT q.account_deleted
       AND (q.lim IS NULL OR q.used + p_units <= q.lim)
 RETURNING q.account_id, q.metric, q.period, q.used, q.lim, q.limit_source, q.chain_id, q.chain_at, q.chain_seq, q.chain_prev, q.chain_hash
)
INSERT INTO ledger (id, at, seq, account_id, metric, period, kind, units, used_after, lim, limit_source,
                    idempotency_key, actor, prev_hash, hash)
OVERRIDING SYSTEM VALUE
SELECT g.chain_id, g.chain_at, g.chain_seq, g.account_id, g.metric, g.period, 'take', p_units, g.used, g.lim, g.limit_source,
       p_idempotency_key, p_actor, g.chain_prev, g.chain_hash
  FROM granted g
RETURNING ledger.id, ledger.metric, ledger.units, ledger.used_after, ledger.lim, ledger.period, ledger.limit_source
     INTO take_id, metric, units, used, "limit", period, limit_source;
END
$f$;

-- take_fn_locked: three single-row statements that Citus's fast-path router plans on the worker's
-- own shard: lock the counter (the limit checked on the newest row version), draw the ledger id
-- and time after the lock (chain order = id order), then the counter's UPDATE and the ledger INSERT
-- with the values computed in PL/pgSQL (Citus refuses volatile functions, and stable ones with
-- column references, in a routed UPDATE).
CREATE OR REPLACE FUNCTION take_fn_locked(p_account_id text, p_metric text, p_units bigint, p_period text,
                           p_idempotency_key text, p_actor text,
                           OUT take_id bigint, OUT metric text, OUT units bigint, OUT used bigint, OUT "limit" bigint, OUT period text, OUT limit_source text)
LANGUAGE plpgsql AS $f$
DECLARE
    q record;
    v_id bigint;
    v_at timestamptz;
    v_hash bytea;
BEGIN
    -- the row lock first: the limit is checked on the newest row version, and the id drawn after it
    SELECT s.used, s.lim, s.limit_source, s.chain_hash, s.chain_seq INTO q
      FROM quotas s
     WHERE s.account_id = p_account_id AND s.metric = p_metric AND s.period = p_period
       AND NOT s.account_deleted AND (s.lim IS NULL OR s.used + p_units <= s.lim)
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    v_id := nextval('ledger_id_seq');
    v_at := clock_timestamp();
    v_hash := ledger_hash(q.chain_hash, v_id, v_at, p_account_id, p_metric, p_period, 'take', p_units,
                          q.used + p_units, q.lim, NULL, p_idempotency_key, p_actor);
    UPDATE quotas s
       SET used = q.used + p_units, chain_seq = q.chain_seq + 1, chain_prev = q.chain_hash, chain_id = v_id, chain_at = v_at, chain_hash = v_hash
     WHERE s.account_id = p_account_id AND s.metric = p_metric;
    INSERT INTO ledger (id, at, seq, account_id, metric, period, kind, units, used_after, lim, limit_source,
                        idempotency_key, actor, prev_hash, hash)
    OVERRIDING SYSTEM VALUE
    VALUES (v_id, v_at, q.chain_seq + 1, p_account_id, p_metric, p_period, 'take', p_units, q.used + p_units, q.lim, q.limit_source,
            p_idempotency_key, p_actor, q.chain_hash, v_hash);
    take_id := v_id; metric := p_metric; units := p_units; used := q.used + p_units; "limit" := q.lim;
    period := p_period; limit_source := q.limit_source;
END
$f$;

-- take_delegated as it was before the writers became SECURITY DEFINER functions (main 16a72a0): the
-- base side on Citus for docs/design/ledger-writers.md. It runs as the caller (the bench's owner).
CREATE OR REPLACE FUNCTION take_delegated_before(
    p_account_id text, p_metric text, p_units bigint, p_period text, p_idempotency_key text, p_actor text,
    OUT take_id bigint, OUT metric text, OUT units bigint, OUT used bigint, OUT "limit" bigint,
    OUT period text, OUT limit_source text
) LANGUAGE plpgsql AS $f$
DECLARE
    q record;
    v_id bigint;
    v_at timestamptz;
    v_hash bytea;
BEGIN
    SELECT s.used, s.lim, s.limit_source, s.chain_hash, s.chain_seq INTO q
      FROM quotas s
     WHERE s.account_id = p_account_id AND s.metric = p_metric AND s.period = p_period
       AND NOT s.account_deleted AND (s.lim IS NULL OR s.used + p_units <= s.lim)
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    v_id := nextval('ledger_id_seq');
    v_at := clock_timestamp();
    v_hash := ledger_hash(q.chain_hash, v_id, v_at, p_account_id, p_metric, p_period, 'take', p_units,
                          q.used + p_units, q.lim, NULL, p_idempotency_key, p_actor);
    UPDATE quotas s
       SET used = q.used + p_units, chain_seq = q.chain_seq + 1,
           chain_prev = q.chain_hash, chain_id = v_id, chain_at = v_at, chain_hash = v_hash
     WHERE s.account_id = p_account_id AND s.metric = p_metric;
    INSERT INTO ledger (id, at, seq, account_id, metric, period, kind, units, used_after, lim, limit_source,
                        idempotency_key, actor, prev_hash, hash)
    OVERRIDING SYSTEM VALUE
    VALUES (v_id, v_at, q.chain_seq + 1, p_account_id, p_metric, p_period, 'take', p_units, q.used + p_units,
            q.lim, q.limit_source, p_idempotency_key, p_actor, q.chain_hash, v_hash);
    take_id := v_id; metric := p_metric; units := p_units; used := q.used + p_units; "limit" := q.lim;
    period := p_period; limit_source := q.limit_source;
END
$f$;


-- ledger_take_before_alerts: the service's take function as it was before events out (issue 26)
-- gave it the alert line (migrations/repeatable/ledger_writers.sql at main 238597f): the base side
-- of "a take that crosses no threshold pays nothing for this" (bench/README.md, "Events out").
CREATE OR REPLACE FUNCTION ledger_take_before_alerts(
    p_account_id text, p_metric text, p_units bigint, p_period text, p_idempotency_key text, p_actor text
) RETURNS TABLE (take_id bigint, metric text, units bigint, used bigint, "limit" bigint, period text,
                 limit_source text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $f$
#variable_conflict use_column
BEGIN
RETURN QUERY
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
           q.chain_prev, q.chain_hash
), entry AS (
    INSERT INTO ledger (id, at, seq, account_id, metric, period, kind, units, used_after, lim, limit_source,
                        idempotency_key, actor, prev_hash, hash)
    OVERRIDING SYSTEM VALUE
    SELECT g.chain_id, g.chain_at, g.chain_seq, g.account_id, g.metric, g.period, 'take', p_units, g.used, g.lim,
           g.limit_source, p_idempotency_key, p_actor, g.chain_prev, g.chain_hash
      FROM granted g
 RETURNING ledger.id, ledger.metric, ledger.period, ledger.units, ledger.used_after, ledger.lim,
           ledger.limit_source
)
SELECT e.id, e.metric, e.units::bigint, e.used_after::bigint, e.lim, e.period, e.limit_source
  FROM entry e;
END
$f$;
