-- depends: 0021.row_rules_off_the_take_path
-- Periods of every kind of metric (service/quota/periods.py): a counter and its ledger rows are in a
-- month (YYYY-MM), a UTC day (YYYY-MM-DD) for a consumable reset daily, or `held` for an allocation
-- (seats), which has no period and is never reset. The daily reset keeps its run rows in job_runs.
--
-- Wider rules only: every stored value met the narrower one, so the new rules are added NOT VALID
-- (no read of the tables; still enforced on every new value).
--
-- One statement (a DO block), as 0021: a statement after ALTER DOMAIN ... DROP CONSTRAINT in a
-- savepoint of its own (yoyo runs each in one) fails with "unprocessed inval messages" on PG 15.
DO $$
BEGIN
    ALTER DOMAIN quota_period DROP CONSTRAINT quota_period_check;
    ALTER DOMAIN quota_period ADD CONSTRAINT quota_period_check
        CHECK (VALUE ~ '^[0-9]{4}-(0[1-9]|1[0-2])(-(0[1-9]|[12][0-9]|3[01]))?$' OR VALUE = 'held') NOT VALID;

    ALTER TABLE job_runs DROP CONSTRAINT job_runs_period_check;
    ALTER TABLE job_runs ADD CONSTRAINT job_runs_period_check
        CHECK (period ~ '^[0-9]{4}-(0[1-9]|1[0-2])(-(0[1-9]|[12][0-9]|3[01]))?$') NOT VALID;
END
$$;
