-- Core schema: accounts, quotas (limits + counter), the append-only ledger, API keys, the audit log.
-- Every table carries account_id (or is tiny and global) so that account_id can be the distribution key.

CREATE TABLE accounts (
    id                  text PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9._:@-]{1,128}$'),
    kind                text NOT NULL CHECK (kind IN ('user', 'team')),
    plan                text NOT NULL,
    subscription_status text NOT NULL DEFAULT 'none' CHECK (subscription_status IN
                        ('none', 'trialing', 'active', 'past_due', 'unpaid', 'incomplete', 'paused',
                         'canceled', 'expired')),
    stripe_customer_id  text UNIQUE,
    deleted             boolean NOT NULL DEFAULT false,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now()
);

-- One row per (account, metric): the limits that decide a take and the counter of the open period.
-- The effective limit is a generated column so that a take reads and re-checks a single row under
-- READ COMMITTED (a joined plans table could be read stale by the re-check).
CREATE TABLE quotas (
    account_id      text NOT NULL REFERENCES accounts (id),
    metric          text NOT NULL,
    plan_limit      bigint CHECK (plan_limit >= 0),          -- the account's plan; NULL = unlimited
    free_limit      bigint CHECK (free_limit >= 0),          -- the free plan's, for a lapsed paid plan
    override_set    boolean NOT NULL DEFAULT false,          -- sticky admin override present
    override_limit  bigint CHECK (override_limit >= 0),      -- NULL with override_set = unlimited
    lapsed          boolean NOT NULL DEFAULT false,          -- paid plan whose subscription keeps no access
    account_deleted boolean NOT NULL DEFAULT false,          -- copy of accounts.deleted, read by takes
    period          text NOT NULL CHECK (period ~ '^[0-9]{4}-(0[1-9]|1[0-2])$'),
    used            bigint NOT NULL DEFAULT 0 CHECK (used >= 0),
    lim             bigint GENERATED ALWAYS AS (
                        CASE WHEN override_set THEN override_limit
                             WHEN lapsed THEN free_limit
                             ELSE plan_limit END) STORED,
    limit_source    text GENERATED ALWAYS AS (
                        CASE WHEN override_set THEN 'override'
                             WHEN lapsed THEN 'free_fallback'
                             ELSE 'plan' END) STORED,
    PRIMARY KEY (account_id, metric),
    CHECK (override_set OR override_limit IS NULL)
);
CREATE INDEX quotas_period ON quotas (period, account_id, metric);

-- The ledger: every take, release and reset, never changed after it is written. Counters in
-- `quotas` are a cache of it: for a counter in period P, used = sum(take) - sum(release) over
-- its P rows after its latest P reset row.
CREATE TABLE ledger (
    id              bigint GENERATED ALWAYS AS IDENTITY,
    at              timestamptz NOT NULL DEFAULT clock_timestamp(),
    account_id      text NOT NULL,
    metric          text NOT NULL,
    period          text NOT NULL,
    kind            text NOT NULL CHECK (kind IN ('take', 'release', 'reset')),
    units           bigint NOT NULL CHECK (units >= 0),
    used_after      bigint NOT NULL CHECK (used_after >= 0),
    lim             bigint,                 -- takes: the effective limit they were granted against
    limit_source    text,
    take_id         bigint,                 -- releases: the take they give back
    idempotency_key text,                   -- takes: the client's key; resets: 'period-open:YYYY-MM'
    actor           text NOT NULL,          -- API key name, or system:<job>
    PRIMARY KEY (account_id, id),
    CHECK ((kind = 'release') = (take_id IS NOT NULL))
);
CREATE INDEX ledger_id ON ledger (id);
CREATE INDEX ledger_period ON ledger (period, id);
-- One take per client idempotency key and account.
CREATE UNIQUE INDEX ledger_take_key ON ledger (account_id, idempotency_key)
    WHERE kind = 'take' AND idempotency_key IS NOT NULL;
-- A take is released at most once.
CREATE UNIQUE INDEX ledger_one_release ON ledger (account_id, take_id) WHERE kind = 'release';
-- A period is opened (rollover or monthly reset) at most once per counter; admin resets have no key.
CREATE UNIQUE INDEX ledger_one_period_open ON ledger (account_id, metric, idempotency_key)
    WHERE kind = 'reset';

CREATE TABLE api_keys (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name       text NOT NULL CHECK (name ~ '^[A-Za-z0-9._:@-]{1,64}$'),
    role       text NOT NULL CHECK (role IN ('product', 'admin', 'finance')),
    key_hash   bytea NOT NULL UNIQUE,       -- sha256 of a 256-bit random key; the key is never stored
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);
CREATE UNIQUE INDEX api_keys_live_name ON api_keys (name) WHERE revoked_at IS NULL;

-- Admin actions and plan-limit changes, never changed after they are written.
CREATE TABLE audit_log (
    id         bigint GENERATED ALWAYS AS IDENTITY,
    at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    actor      text NOT NULL,
    action     text NOT NULL,
    account_id text NOT NULL DEFAULT '',
    metric     text,
    old        jsonb,
    new        jsonb,
    PRIMARY KEY (account_id, id)
);
CREATE INDEX audit_log_id ON audit_log (id);

-- Append-only, enforced by the database: a row trigger refuses UPDATE and DELETE, a statement
-- trigger refuses TRUNCATE (row triggers do not fire for it).
CREATE FUNCTION refuse_append_only_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;

CREATE TRIGGER ledger_append_only BEFORE UPDATE OR DELETE ON ledger
    FOR EACH ROW EXECUTE FUNCTION refuse_append_only_change();
CREATE TRIGGER ledger_no_truncate BEFORE TRUNCATE ON ledger
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_append_only_change();
CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION refuse_append_only_change();
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_append_only_change();

-- Privileges, the second layer: the application role may read and append, nothing more, so even a
-- dropped trigger leaves the ledger closed to it. Run the service as a login role granted quota_app.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'quota_app') THEN
        CREATE ROLE quota_app NOLOGIN;
    END IF;
END
$$;
GRANT SELECT, INSERT, UPDATE, DELETE ON accounts, quotas, api_keys TO quota_app;
GRANT SELECT, INSERT ON ledger, audit_log TO quota_app;
REVOKE UPDATE, DELETE, TRUNCATE ON ledger, audit_log FROM quota_app;
