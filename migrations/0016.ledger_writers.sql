-- depends: 0015.chain_seq
-- Only the service's own operations write history (docs/design/ledger-writers.md).
--
-- Until now the service's role (quota_app) could INSERT into the ledger and the audit log and UPDATE
-- every column of quotas, so whoever held its credentials could append a fully chained row of their
-- own making (backdated into a closed month, naming an admin key) and move the counter's head to it,
-- and verify, reconciliation and usage would all agree with it; it could also add an API key of any
-- role. Now the ledger, the chain heads (quotas' used, period and chain_*) and the audit log change
-- only through the SECURITY DEFINER writers of migrations/repeatable/ledger_writers.sql (and
-- take_delegated), owned by the owner; api_keys only as the owner (`quota-ledger keys`, run as
-- `migrate` is). The role keeps what the service does directly: reading everything, creating
-- counter rows, and setting their limits, overrides and deletion flag.
--
-- And the ledger's own columns are held to their rules (issue: a row with account_id '' was never
-- walked by verify): account_id follows the account-id rule, hash and prev_hash are SHA-256
-- digests, and prev_hash is NULL exactly at a chain's first row. Added NOT VALID, then validated, as in 0005: nothing is rewritten, the existing rows are
-- read once. This migration is one transaction, so the ADD's ACCESS EXCLUSIVE lock is held through
-- that read and takes wait for it (a sequential scan of the ledger; run it in a quiet hour on a big
-- ledger, README "Deploying"). It gives up after 10 s of waiting for the lock rather than queue every
-- take behind a long export; run it again.
SET LOCAL lock_timeout = '10s';
-- On Citus: one connection per worker for the whole migration (the DDL on the distributed ledger and
-- the function change below must share it).
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') THEN
        PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);
    END IF;
END
$$;

REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON ledger, audit_log, api_keys FROM quota_app;
REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON quotas FROM quota_app;
-- What it may still write of quotas is granted column by column in migrations/repeatable/ledger_writers.sql,
-- on every migrate (on Citus, column grants must be made on each shard).

-- One constraint, not three, and 0005's account_key rule written out rather than a cast to the
-- domain: Postgres prepares every CHECK of a table again in each statement that writes it, and a
-- domain cast looks its constraints up again there. The rule as `+` and a length, not the domain's
-- `{1,128}`: the regex engine expands a bounded repetition into that many states, which made the
-- check a noticeable part of a take (docs/design/ledger-writers.md).
ALTER TABLE ledger ADD CONSTRAINT ledger_row_check CHECK (
    account_id ~ '^[A-Za-z0-9._:@-]+$' AND octet_length(account_id) <= 128
    AND octet_length(hash) = 32
    AND (prev_hash IS NULL) = (seq = 1) AND coalesce(octet_length(prev_hash), 32) = 32
) NOT VALID;
ALTER TABLE ledger VALIDATE CONSTRAINT ledger_row_check;

-- The one definer function before these (0010) kept the search_path of its creation, in which a
-- caller's temporary tables come first: pg_temp last, as every writer has it.
ALTER FUNCTION analyze_after_bulk_write() SET search_path = pg_catalog, public, pg_temp;
