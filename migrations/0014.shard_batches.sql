-- depends: 0012.citus
-- Cross-account jobs in batches of one shard (README "Scaling out").
--
-- The monthly reset and plan sync lock the rows of a batch of accounts. Citus refuses a row lock
-- that spans shards (FOR UPDATE / FOR SHARE in a multi-shard query), and a batch that locked on
-- every shard at once would stall every shard's takes behind it. So the jobs read the next batch
-- without locks, group it by the shard that holds each account, and then lock and change one group
-- per transaction with statements filtered by `account_id = ANY(<the group's accounts>)`, which
-- Citus routes to that one shard.
--
-- account_shard(account_id) is that grouping: on Citus, the shard of `accounts` that holds the
-- account (every account table is co-located with it, so it names the account's shard group); on
-- one PostgreSQL, 0 for every account: the whole batch is one group, one set-based statement, as
-- before. The same SQL and the same Python run on both; only this function's body differs, chosen
-- here once, where the migration already knows whether Citus is present (as 0012 does).
CREATE FUNCTION account_shard(account_id text) RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT 0::bigint
$$;

DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') THEN
        CREATE OR REPLACE FUNCTION account_shard(account_id text) RETURNS bigint
        LANGUAGE sql STABLE PARALLEL SAFE AS $f$
            SELECT get_shard_id_for_distribution_column('accounts', account_id)
        $f$;
    END IF;
END
$$;
