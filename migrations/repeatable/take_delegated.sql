-- The take as one function call, for Citus (README "Scaling out", "One round trip per take";
-- service/quota/takes.py). `quota-ledger migrate` applies this file on every run (CREATE OR REPLACE).
--
-- On Citus the take statement (ledger_take in ledger_writers.sql: an UPDATE ... RETURNING in a CTE
-- feeding the ledger INSERT) is planned as coordinator steps. This function, distributed by its account argument and
-- co-located with quotas, is delegated whole to the node that holds the account when called as
-- `SELECT * FROM take_delegated(<parameters>)` in autocommit: one round trip, and inside it three
-- single-row statements that Citus's fast-path router runs on the local shard. It keeps the
-- statement's guarantees: the counter row is locked with the limit re-checked on its newest version
-- (READ COMMITTED re-evaluates the WHERE after a lock wait), so concurrent takes never overshoot; the
-- chain position, id, time and hash come from ledger_link after the lock; the counter and its ledger row change in one
-- call, so a duplicate idempotency key (the INSERT's unique violation) rolls the counter back too.
-- The id comes from the node's own range of ledger_id_seq: ids are only unique, the chain is
-- ordered by seq (migrations/0015). A refused take returns one row of NULLs (a delegated call may
-- carry no WHERE); the caller then diagnoses it as after the statement.
--
-- On one PostgreSQL the service runs ledger_take instead (this function costs more server CPU per
-- take there: bench/README.md); tests/db/test_takes.py holds the two to the same answers and rows.
-- SECURITY DEFINER, as every ledger writer (ledger_writers.sql, migrations/0016).
CREATE OR REPLACE FUNCTION take_delegated(
    p_account_id text, p_metric text, p_units bigint, p_period text, p_idempotency_key text, p_actor text,
    OUT take_id bigint, OUT metric text, OUT units bigint, OUT used bigint, OUT "limit" bigint,
    OUT period text, OUT limit_source text
) LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $f$
DECLARE
    q record;
    link record;
BEGIN
    SELECT s.used, s.lim, s.limit_source, s.chain_hash, s.chain_seq, s.alert_pct INTO q
      FROM quotas s
     WHERE s.account_id = p_account_id AND s.metric = p_metric AND s.period = p_period
       AND NOT s.account_deleted AND (s.lim IS NULL OR s.used + p_units <= s.lim)
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT * INTO link
      FROM ledger_link(q.chain_seq, q.chain_hash, p_account_id, p_metric, p_period, 'take', p_units,
                       q.used + p_units, q.lim, NULL, p_idempotency_key, p_actor);
    UPDATE quotas s
       SET used = q.used + p_units, chain_seq = link.seq,
           chain_prev = link.prev_hash, chain_id = link.id, chain_at = link.at, chain_hash = link.hash
     WHERE s.account_id = p_account_id AND s.metric = p_metric;
    INSERT INTO ledger (id, at, seq, account_id, metric, period, kind, units, used_after, lim, limit_source,
                        idempotency_key, actor, prev_hash, hash)
    OVERRIDING SYSTEM VALUE
    VALUES (link.id, link.at, link.seq, p_account_id, p_metric, p_period, 'take', p_units, q.used + p_units,
            q.lim, q.limit_source, p_idempotency_key, p_actor, link.prev_hash, link.hash);
    IF threshold_reached(q.used + p_units, q.lim, q.alert_pct) THEN
        PERFORM quota_alert(p_account_id, p_metric);  -- the take reached the alert line (events_out.sql)
    END IF;
    take_id := link.id; metric := p_metric; units := p_units; used := q.used + p_units; "limit" := q.lim;
    period := p_period; limit_source := q.limit_source;
END
$f$;

REVOKE ALL ON FUNCTION take_delegated(text, text, bigint, text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION take_delegated(text, text, bigint, text, text, text) TO quota_app;

-- On Citus: distributed by the account, co-located with quotas. It runs on the worker as the owner
-- (SECURITY DEFINER, as every ledger writer: migrations/repeatable/ledger_writers.sql), so it draws
-- from the worker's ledger_id_seq with the owner's rights.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') THEN
        PERFORM create_distributed_function(
            'take_delegated(text, text, bigint, text, text, text)', 'p_account_id',
            colocate_with := 'quotas');
    END IF;
END
$$;
