-- depends: 0009.ledger_chain
-- Scale out on Citus (README "Scaling out"). On plain PostgreSQL this migration does nothing: the
-- schema there is already keyed by account. When the `citus` extension is present in the database
-- (CREATE EXTENSION citus, its workers added, before `migrate`), it distributes the tables:
--
-- * accounts, quotas, ledger, audit_log: distributed by account (accounts.id, the others'
--   account_id), co-located, so that every per-account statement, the take's UPDATE + INSERT
--   included, touches one shard group with its full transactional guarantees. Their unique indexes all
--   start with account_id, so each is enforced on its shard: one take per idempotency key, one
--   release per take, one period opening per counter.
-- * api_keys, job_runs, and the billing tables (webhook_events, subscriptions, customer_links):
--   reference tables, a copy on every node. The first two are tiny and read by everyone. The billing
--   ones are found by provider ids, not by account (an event's account is known only once it is
--   resolved; a subscription moves between accounts), and a reference table joins any one account's
--   shard on that shard, so a delivery's effect on its account can stay on one shard; the price is a
--   write on every node per delivery (webhooks are rare next to takes). The delivery statement
--   names its account for that (with 0013), though Citus does not run it yet (README "Scaling out").
--
-- What Citus requires, and why each change keeps the guarantee:
-- * Co-location needs one type for the distribution columns: accounts.id goes back from the
--   account_key domain (0005) to text, with the same rule as a table CHECK.
-- * A unique constraint on a distributed table must contain the distribution column, so
--   UNIQUE (stripe_customer_id) cannot stay; 0013 holds it in a table keyed by the customer.
-- * Foreign keys from a reference table to a distributed one are refused: subscriptions' and
--   customer_links' to accounts go (every writer resolves the account through accounts first,
--   under its row lock). quotas' stays: it joins two co-located tables on the distribution column.
-- * Triggers on distributed tables: Citus runs them on each shard when allowed
--   (citus.enable_unsafe_triggers, for this transaction: the triggers are copied to the shards as
--   they are created). The append-only triggers only refuse, they touch no other shard, which is
--   what makes them safe; tests/citus checks UPDATE, DELETE and TRUNCATE are refused on the cluster.
-- * Writers draw ledger ids with nextval('ledger_id_seq') in the counter's UPDATE. PostgreSQL draws
--   it again after a lock wait (0009: chain order is id order); Citus draws it once, on the
--   coordinator, before it sends the UPDATE to the shard, so a writer that waited for the
--   counter's row could chain an id lower than the one before it (and a take could land "before" a
--   reset it followed). quotas_chain_in_id_order refuses that on the shard with SQLSTATE 40001
--   (serialization_failure): the statement rolls back whole and the writer runs it again with a
--   new id (service/quota/takes.py). Ids stay one sequence, in chain order per counter.
-- * Grants on the tables are copied to their shards and reference copies when they are created.
DO $$
DECLARE
    has_citus boolean := EXISTS (SELECT FROM pg_extension WHERE extname = 'citus');
BEGIN
    IF NOT has_citus THEN
        RETURN;
    END IF;
    PERFORM set_config('citus.enable_unsafe_triggers', 'on', true);
    -- One connection per worker for the whole migration: DDL and shard creation in one transaction
    -- that also touches tables with foreign keys must not fan out over several connections.
    PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);

    ALTER TABLE subscriptions DROP CONSTRAINT subscriptions_account_id_fkey;
    ALTER TABLE customer_links DROP CONSTRAINT customer_links_account_id_fkey;
    ALTER TABLE quotas DROP CONSTRAINT quotas_account_id_fkey;
    ALTER TABLE accounts DROP CONSTRAINT accounts_stripe_customer_id_key;
    ALTER TABLE accounts
        ALTER COLUMN id TYPE text,
        ADD CONSTRAINT accounts_id_check CHECK (id ~ '^[A-Za-z0-9._:@-]{1,128}$');
    CREATE INDEX accounts_stripe_customer ON accounts (stripe_customer_id)
        WHERE stripe_customer_id IS NOT NULL;

    -- The error names the table, not the shard that raised it (ledger_102008).
    CREATE OR REPLACE FUNCTION refuse_append_only_change() RETURNS trigger LANGUAGE plpgsql AS $f$
    BEGIN
        RAISE EXCEPTION '% is append-only: % refused', regexp_replace(TG_TABLE_NAME, '_[0-9]+$', ''), TG_OP
            USING ERRCODE = 'insufficient_privilege';
    END
    $f$;
    CREATE FUNCTION quotas_chain_in_id_order() RETURNS trigger LANGUAGE plpgsql AS $f$
    BEGIN
        RAISE EXCEPTION 'ledger id % was drawn before the counter''s newest row % was written; draw again',
                        NEW.chain_id, OLD.chain_id
            USING ERRCODE = 'serialization_failure';
    END
    $f$;
    CREATE TRIGGER quotas_chain_in_id_order BEFORE UPDATE ON quotas FOR EACH ROW
        WHEN (NEW.chain_id < OLD.chain_id) EXECUTE FUNCTION quotas_chain_in_id_order();

    PERFORM create_distributed_table('accounts', 'id');
    PERFORM create_distributed_table('quotas', 'account_id', colocate_with => 'accounts');
    ALTER TABLE quotas ADD CONSTRAINT quotas_account_id_fkey FOREIGN KEY (account_id) REFERENCES accounts (id);
    PERFORM create_distributed_table('ledger', 'account_id', colocate_with => 'accounts');
    PERFORM create_distributed_table('audit_log', 'account_id', colocate_with => 'accounts');

    PERFORM create_reference_table('api_keys');
    PERFORM create_reference_table('job_runs');
    PERFORM create_reference_table('webhook_events');
    PERFORM create_reference_table('subscriptions');
    PERFORM create_reference_table('customer_links');
END
$$;
