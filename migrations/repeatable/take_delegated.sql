-- The take as one function call, for Citus (README "Scaling out", "One round trip per take";
-- service/quota/takes.py). `quota-ledger migrate` applies this file on every run (CREATE OR REPLACE).
--
-- On Citus the take statement (takes.sql `take`: an UPDATE ... RETURNING in a CTE feeding the ledger
-- INSERT) is planned as coordinator steps. This function, distributed by its account argument and
-- co-located with quotas, is delegated whole to the node that holds the account when called as
-- `SELECT * FROM take_delegated(<parameters>)` in autocommit: one round trip, and inside it three
-- single-row statements that Citus's fast-path router runs on the local shard. It keeps the
-- statement's guarantees: the counter row is locked with the limit re-checked on its newest version
-- (READ COMMITTED re-evaluates the WHERE after a lock wait), so concurrent takes never overshoot; the
-- chain position, id and time are drawn after the lock; the counter and its ledger row change in one
-- call, so a duplicate idempotency key (the INSERT's unique violation) rolls the counter back too.
-- The id comes from the node's own range of ledger_id_seq: ids are only unique, the chain is
-- ordered by seq (migrations/0015). A refused take returns one row of NULLs (a delegated call may
-- carry no WHERE); the caller then diagnoses it as after the statement.
--
-- On one PostgreSQL the service runs the statement instead (the function costs more server CPU per
-- take there: bench/README.md); tests/db/test_takes.py holds the two to the same answers and rows.
CREATE OR REPLACE FUNCTION take_delegated(
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

-- On Citus: distributed by the account, co-located with quotas. The function draws the ledger id on
-- the worker, whose copy of ledger_id_seq Citus creates without 0009's grant (a GRANT on the
-- coordinator's sequence is not propagated), so the service's role is granted it on every worker
-- here, on every `migrate`: run `migrate` again after adding a worker.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') THEN
        PERFORM create_distributed_function(
            'take_delegated(text, text, bigint, text, text, text)', 'p_account_id',
            colocate_with := 'quotas');
        IF EXISTS (SELECT FROM run_command_on_workers('GRANT USAGE ON SEQUENCE public.ledger_id_seq TO quota_app')
                    WHERE NOT success) THEN
            RAISE EXCEPTION 'could not grant the use of ledger_id_seq on every worker';
        END IF;
    END IF;
END
$$;
