-- depends: 0006.quotas_follow_plan
-- Tamper-evident ledger: every row carries a SHA-256 chained to the previous row of the same counter
-- (account, metric), so that a row changed, removed or inserted behind the triggers' back (by a
-- superuser, a restored backup, an edit on disk) is found by `quota-ledger ledger verify`.
--
-- hash = sha256(prev_hash || canonical fields), prev_hash = the hash of the counter's previous row
-- (NULL for its first). The canonical form is documented in the README ("The ledger's hash chain")
-- and implemented twice on purpose: here, for the writers, and in service/quota/chain.py, for
-- verify, which must not trust code stored in the database it checks.
--
-- The chain's head lives on the counter row (quotas.chain_*): every writer of a counter's ledger
-- rows already holds that row's lock, so the head orders the chain under any concurrency, and a take
-- stays one statement. The UPDATE of the counter draws the row's id and time and computes its hash
-- in the same projection that is re-evaluated on the newest row version after a lock wait, so
-- chain order is id order; the INSERT then writes the values the UPDATE returned. (An UPDATE cannot
-- return a column's old value in Postgres 15, hence chain_prev beside chain_hash.)
ALTER TABLE ledger ADD COLUMN prev_hash bytea, ADD COLUMN hash bytea;
ALTER TABLE quotas
    ADD COLUMN chain_id   bigint,       -- id of the counter's newest ledger row
    ADD COLUMN chain_at   timestamptz,  -- its time
    ADD COLUMN chain_prev bytea,        -- its prev_hash
    ADD COLUMN chain_hash bytea;        -- its hash: the head of the counter's chain

-- The canonical form: each field as text (numbers in decimal, `at` as microseconds since the Unix
-- epoch), written as its length in UTF-8 bytes, a colon and the text; a NULL field is a lone colon.
-- A scalar SQL function, so the planner inlines it into the writers' statements.
CREATE FUNCTION ledger_hash(
    prev_hash bytea, id bigint, at timestamptz, account_id text, metric text, period text, kind text,
    units bigint, used_after bigint, lim bigint, take_id bigint, idempotency_key text, actor text
) RETURNS bytea LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT sha256(coalesce(prev_hash, '\x'::bytea) || convert_to(concat(
        octet_length(id::text), ':', id,
        octet_length((extract(epoch FROM at) * 1000000)::bigint::text), ':',
            (extract(epoch FROM at) * 1000000)::bigint,
        octet_length(account_id), ':', account_id,
        octet_length(metric), ':', metric,
        octet_length(period), ':', period,
        octet_length(kind), ':', kind,
        octet_length(units::text), ':', units,
        octet_length(used_after::text), ':', used_after,
        octet_length(lim::text), ':', lim,
        octet_length(take_id::text), ':', take_id,
        octet_length(idempotency_key), ':', idempotency_key,
        octet_length(actor), ':', actor), 'UTF8'))
$$;

-- Writers draw ledger ids themselves (nextval in the counter's UPDATE).
GRANT USAGE ON SEQUENCE ledger_id_seq TO quota_app;

-- Chain the rows written before this migration, counter by counter in id order. The one sanctioned
-- UPDATE of the ledger: the append-only trigger is off for this transaction only (ALTER TABLE
-- holds a lock that keeps every other writer of the ledger out until it commits).
ALTER TABLE ledger DISABLE TRIGGER ledger_append_only;
DO $$
DECLARE
    r record;
    prev bytea;
    last_account text;
    last_metric text;
BEGIN
    FOR r IN SELECT * FROM ledger ORDER BY account_id, metric, id LOOP
        IF r.account_id IS DISTINCT FROM last_account OR r.metric IS DISTINCT FROM last_metric THEN
            prev := NULL;
            last_account := r.account_id;
            last_metric := r.metric;
        END IF;
        UPDATE ledger
           SET prev_hash = prev,
               hash = ledger_hash(prev, r.id, r.at, r.account_id, r.metric, r.period, r.kind, r.units,
                                  r.used_after, r.lim, r.take_id, r.idempotency_key, r.actor)
         WHERE account_id = r.account_id AND id = r.id
     RETURNING hash INTO prev;
    END LOOP;
END
$$;
ALTER TABLE ledger ENABLE TRIGGER ledger_append_only;

UPDATE quotas q
   SET chain_id = l.id, chain_at = l.at, chain_prev = l.prev_hash, chain_hash = l.hash
  FROM (SELECT DISTINCT ON (account_id, metric) account_id, metric, id, at, prev_hash, hash
          FROM ledger ORDER BY account_id, metric, id DESC) AS l
 WHERE q.account_id = l.account_id AND q.metric = l.metric;

-- A writer that forgets to chain fails loudly instead of leaving a gap for verify to report.
ALTER TABLE ledger ALTER COLUMN hash SET NOT NULL;
