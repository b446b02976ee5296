-- depends: 0014.shard_batches
-- A chain position per counter (README "The ledger's hash chain", "Scaling out").
--
-- Until now a counter's chain was ordered by ledger id: every writer drew nextval('ledger_id_seq')
-- in the counter's UPDATE, after the row lock, and on Citus a trigger refused an id drawn before the
-- lock (quotas_chain_in_id_order, 0012) so that the writer drew again. Here the chain gets its own
-- order: ledger.seq is the row's position in its counter's chain (1, 2, 3 ...) and quotas.chain_seq
-- the head's, which every writer increments in the same SET that computes the row's hash, under the
-- row lock, and writes into the row. Ids need only be unique now, drawn wherever the writer runs
-- (on a Citus worker, from that node's range of the sequence), so the trigger goes.
--
-- seq does not enter the row hash: prev_hash already links each row to the one before it, so a row
-- removed, inserted or moved is found through the links whatever its seq says, and a seq changed
-- behind the triggers' back is found by the walk itself (a gap or a repeat in 1, 2, 3 ..., or rows
-- whose links no longer follow in seq order). Keeping it out leaves every hash written before this
-- migration valid: history is not rehashed.
--
-- The backfill numbers existing rows in id order per counter, the order they were chained in. It is
-- the one sanctioned UPDATE of the ledger since 0009: the append-only trigger is off for this
-- transaction only (ALTER TABLE holds a lock that keeps every other writer out until it commits).
-- On Citus, ALTER TABLE ... DISABLE/ENABLE TRIGGER and the UPDATE (joined on the distribution
-- column, the window partitioned by it) run on every shard; the unique index contains the
-- distribution column, so each shard enforces it.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') THEN
        PERFORM set_config('citus.enable_unsafe_triggers', 'on', true);
        PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);
    END IF;
END
$$;

-- Upgrading: this rewrites every ledger row under an exclusive lock on ledger and quotas, so every
-- take waits until it commits (README "Deploying"). It gives up after 10 s of waiting for those locks
-- (a long export or verify holding them) rather than queueing every take behind it; run it again.
-- quotas first, then ledger: the order writers lock them in, so a writer caught in between cannot
-- deadlock with it.
SET LOCAL lock_timeout = '10s';
-- 0: no row yet. A constant default is metadata only in PostgreSQL 11+: quotas is not rewritten.
ALTER TABLE quotas ADD COLUMN chain_seq bigint NOT NULL DEFAULT 0;
ALTER TABLE ledger ADD COLUMN seq bigint;

ALTER TABLE ledger DISABLE TRIGGER ledger_append_only;
UPDATE ledger l
   SET seq = n.seq
  FROM (SELECT account_id, id, row_number() OVER (PARTITION BY account_id, metric ORDER BY id) AS seq
          FROM ledger) AS n
 WHERE l.account_id = n.account_id AND l.id = n.id;
ALTER TABLE ledger ENABLE TRIGGER ledger_append_only;
ALTER TABLE ledger ALTER COLUMN seq SET NOT NULL;
CREATE UNIQUE INDEX ledger_chain_seq ON ledger (account_id, metric, seq);
-- A period's rows in chain order, counter by counter: the order of the period export and of the
-- reconciliation's window (service/quota/ledger.sql), which then stream from the index instead of
-- sorting the whole period first. It replaces (period, id), whose id order means nothing on Citus now,
-- so a take still writes as many indexes as before.
DROP INDEX ledger_period;
CREATE INDEX ledger_period ON ledger (period, account_id, metric, seq);

UPDATE quotas q
   SET chain_seq = l.seq
  FROM (SELECT account_id, metric, max(seq) AS seq FROM ledger GROUP BY account_id, metric) AS l
 WHERE q.account_id = l.account_id AND q.metric = l.metric;

DROP TRIGGER IF EXISTS quotas_chain_in_id_order ON quotas;
DROP FUNCTION IF EXISTS quotas_chain_in_id_order();

-- The planner's statistics for the new column and indexes (as after any bulk write: 0010).
ANALYZE quotas;
ANALYZE ledger;
