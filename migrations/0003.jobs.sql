-- Job runs: one row per (job, period). The row is what makes a periodic job happen once per period
-- (a second runner finds it `done`), and it carries the progress of a run that commits in batches,
-- so a run killed midway resumes where it stopped. A small global table, not an account table.
CREATE TABLE job_runs (
    job            text NOT NULL,
    period         text NOT NULL CHECK (period ~ '^[0-9]{4}-(0[1-9]|1[0-2])$'),
    status         text NOT NULL DEFAULT 'running' CHECK (status IN ('running', 'done')),
    started_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at    timestamptz,
    batches        integer NOT NULL DEFAULT 0,
    counters_reset bigint NOT NULL DEFAULT 0,   -- counters this run moved into the period
    reset_rows     bigint NOT NULL DEFAULT 0,   -- of which had usage, so got a reset ledger row
    -- keyset position of the last committed batch, in the order of the quotas_period index
    cursor_period  text,
    cursor_account text,
    cursor_metric  text,
    runner         text,                        -- host:pid that committed the last batch
    PRIMARY KEY (job, period),
    CHECK ((status = 'done') = (finished_at IS NOT NULL))
);

GRANT SELECT, INSERT, UPDATE ON job_runs TO quota_app;
