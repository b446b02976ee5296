-- depends: 0019.key_rotation 0020.function_grants
-- The rules of the rows a take writes, kept whole, moved to where a take pays least for them
-- (docs/design/ledger-writers.md, "What a take pays for its rules"; bench/ledger_writers.md).
--
-- Postgres reads every CHECK constraint of a table back from its stored text and plans it again in
-- each statement that writes the table, and an UPDATE checks all of them whatever columns it sets.
-- A take is one such statement per row, so its table CHECKs were about a sixth of its instructions.
-- A domain's rule is cached with its type; a trigger limited to some columns (UPDATE OF) is not
-- even looked at by an UPDATE that sets none of them.
--
-- * ledger: kind, units, used_after, hash and prev_hash take domains (ledger_kind, quota_units,
--   chain_digest), account_id the accounts' domain account_key, whose pattern is written as `+`
--   and a length (the same rule: the regex engine expands `{1,128}` into as many states, which made
--   each match cost microseconds). What spans columns stays one table CHECK, ledger_links_check.
-- * quotas: the four rules on its limit columns move from CHECKs to a trigger on those columns,
--   with the rules as its WHEN condition, which refuses (check_violation, as before) only a row
--   that breaks one. A take sets `used` and the chain head, never a limit.
--
-- In place, as 0005: a column changes to a domain without a rewrite while the domain has no rule,
-- so the rules are added after the switch, NOT VALID, then validated (one read of each table).
--
-- The three partial unique indexes of the ledger name `kind` in their conditions, so Postgres builds
-- them again; with the validation, that holds the ledger's exclusive lock for a time that grows with
-- the ledger (docs/operations.md, "Upgrading"). It gives up after 10 s of waiting for that lock
-- rather than queue every take behind a long export; run it again.
--
-- One PostgreSQL only: on Citus a take's cost is its distributed execution (the rules are a point
-- of it there), ledger.account_id is the distribution column, which cannot change type, and
-- accounts.id left the domain (0012); the table CHECKs of 0001 and 0016 stay.
SET LOCAL lock_timeout = '10s';
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') THEN
        RETURN;
    END IF;

    CREATE DOMAIN ledger_kind AS text;
    CREATE DOMAIN chain_digest AS bytea;
    ALTER DOMAIN account_key DROP CONSTRAINT account_key_check;
    ALTER DOMAIN quota_units DROP CONSTRAINT quota_units_check;
    ALTER TABLE ledger
        DROP CONSTRAINT ledger_kind_check, ALTER COLUMN kind TYPE ledger_kind,
        DROP CONSTRAINT ledger_units_check, ALTER COLUMN units TYPE quota_units,
        DROP CONSTRAINT ledger_used_after_check, ALTER COLUMN used_after TYPE quota_units,
        DROP CONSTRAINT ledger_check, DROP CONSTRAINT ledger_row_check,
        ALTER COLUMN account_id TYPE account_key,
        ALTER COLUMN prev_hash TYPE chain_digest, ALTER COLUMN hash TYPE chain_digest;

    ALTER DOMAIN account_key ADD CONSTRAINT account_key_check
        CHECK (VALUE ~ '^[A-Za-z0-9._:@-]+$' AND octet_length(VALUE) <= 128) NOT VALID;
    ALTER DOMAIN quota_units ADD CONSTRAINT quota_units_check CHECK (VALUE >= 0) NOT VALID;
    ALTER DOMAIN ledger_kind ADD CONSTRAINT ledger_kind_check
        CHECK (VALUE IN ('take', 'release', 'reset')) NOT VALID;
    ALTER DOMAIN chain_digest ADD CONSTRAINT chain_digest_check CHECK (octet_length(VALUE) = 32) NOT VALID;
    -- A release names its take and nothing else does; a counter's first row alone has no previous hash.
    ALTER TABLE ledger ADD CONSTRAINT ledger_links_check
        CHECK ((kind = 'release') = (take_id IS NOT NULL) AND (prev_hash IS NULL) = (seq = 1)) NOT VALID;
    ALTER DOMAIN account_key VALIDATE CONSTRAINT account_key_check;
    ALTER DOMAIN quota_units VALIDATE CONSTRAINT quota_units_check;
    ALTER DOMAIN ledger_kind VALIDATE CONSTRAINT ledger_kind_check;
    ALTER DOMAIN chain_digest VALIDATE CONSTRAINT chain_digest_check;
    ALTER TABLE ledger VALIDATE CONSTRAINT ledger_links_check;

    CREATE FUNCTION refuse_quota_limits() RETURNS trigger
    LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $f$
    BEGIN
        RAISE EXCEPTION 'new row for relation "quotas" violates its limit rules'
            USING ERRCODE = 'check_violation',
                  DETAIL = format('Limits are at least 0, and an override limit needs override_set: '
                                  'plan_limit %s, free_limit %s, override_set %s, override_limit %s.',
                                  NEW.plan_limit, NEW.free_limit, NEW.override_set, NEW.override_limit);
    END
    $f$;
    ALTER TABLE quotas
        DROP CONSTRAINT quotas_plan_limit_check, DROP CONSTRAINT quotas_free_limit_check,
        DROP CONSTRAINT quotas_override_limit_check, DROP CONSTRAINT quotas_check;
    CREATE TRIGGER quotas_limit_rules
        BEFORE INSERT OR UPDATE OF plan_limit, free_limit, override_set, override_limit ON quotas
        FOR EACH ROW
        WHEN (NEW.plan_limit < 0 OR NEW.free_limit < 0 OR NEW.override_limit < 0
              OR NOT (NEW.override_set OR NEW.override_limit IS NULL))
        EXECUTE FUNCTION refuse_quota_limits();
END
$$;
