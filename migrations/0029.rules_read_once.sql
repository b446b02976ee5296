-- depends: 0028.relay_role
-- The two rules a take still paid to read back on every statement, kept whole and enforced as
-- before, in forms that cost a take nothing or half (docs/design/ledger-writers.md, "What a take
-- pays for its rules"; bench/ledger_writers.md, "0029"):
--
-- * quotas.lim and .limit_source, the effective limit and where it comes from, were generated
--   columns. PostgreSQL 15 reads both generation expressions back from their stored text and plans
--   them again in every statement that updates a counter, whatever the statement sets, to learn
--   that a take (which sets `used` and the chain head) changes none of their inputs: 55,000 of a
--   take's 808,000 instructions. They become plain columns that the trigger quotas_effective_limit
--   sets, BEFORE INSERT or an UPDATE OF any of their inputs (or of themselves, so that a direct
--   write is computed over, as a generated column would refuse it); an UPDATE that sets none of
--   those columns, as every take and every reset, never looks at it. The rule is 0001's CASE,
--   unchanged (tests/db/test_effective_limit.py holds the trigger to it on every write of each
--   input; the API's tests run on Citus too, where the generated columns stay).
-- * ledger_links_check (a release and a grant's draw name their take, nothing else does; a chain's
--   first row alone has no previous hash) was read back and planned again for every ledger row
--   written: 81,000 instructions a take. The same rule is now one call of ledger_links_ok, a
--   PL/pgSQL function, whose compiled body is cached for the session: 40,000.
--
-- Instant: catalog changes only (DROP EXPRESSION keeps every stored value and rewrites nothing),
-- under an exclusive lock on quotas and then on ledger, the order a take takes them in (the other
-- would deadlock with a take in flight). While it waits for the ledger's lock (behind a long export),
-- takes wait too: lock_timeout bounds that to 10 s, after which it gives up and is run again.
-- The new CHECK is added NOT VALID, which enforces it on every row written from now on; 0030
-- validates the rows already there (the same rule held them) without blocking takes.
--
-- One PostgreSQL only, as 0021: on Citus the columns stay generated and the CHECK a table CHECK
-- (a trigger on a distributed table needs citus.enable_unsafe_triggers, and a take's cost there is
-- its distributed execution).
SET LOCAL lock_timeout = '10s';
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') THEN
        RETURN;
    END IF;

    CREATE FUNCTION quotas_effective_limit() RETURNS trigger
    LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $f$
    BEGIN
        -- an admin override, else the free plan's limit for a lapsed paid plan, else the plan's
        NEW.lim := CASE WHEN NEW.override_set THEN NEW.override_limit
                        WHEN NEW.lapsed THEN NEW.free_limit
                        ELSE NEW.plan_limit END;
        NEW.limit_source := CASE WHEN NEW.override_set THEN 'override'
                                 WHEN NEW.lapsed THEN 'free_fallback'
                                 ELSE 'plan' END;
        RETURN NEW;
    END
    $f$;
    ALTER TABLE quotas ALTER COLUMN lim DROP EXPRESSION, ALTER COLUMN limit_source DROP EXPRESSION;
    CREATE TRIGGER quotas_effective_limit
        BEFORE INSERT OR UPDATE OF plan_limit, free_limit, override_set, override_limit, lapsed, lim, limit_source
        ON quotas
        FOR EACH ROW EXECUTE FUNCTION quotas_effective_limit();

    CREATE FUNCTION ledger_links_ok(kind text, take_id bigint, prev_hash bytea, seq bigint) RETURNS boolean
    -- No SET search_path, which a function saves and restores on every call (here, every row): the
    -- ledger's only writers are the definer functions, whose fixed path (pg_catalog first) holds
    -- while their INSERT checks this.
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $f$
    BEGIN
        RETURN (kind IN ('release', 'grant_take', 'grant_release', 'grant_forfeit')) = (take_id IS NOT NULL)
           AND (prev_hash IS NULL) = (seq = 1);
    END
    $f$;
    ALTER TABLE ledger DROP CONSTRAINT ledger_links_check;
    ALTER TABLE ledger ADD CONSTRAINT ledger_links_check CHECK (ledger_links_ok(kind, take_id, prev_hash, seq))
        NOT VALID;
END
$$;
