-- depends: 0025.inbox_by_account
-- Credits (issue 25): grants of units of a consumable metric on top of the plan's allowance
-- (README "Credits", docs/ledger.md "Grants in the ledger").
--
-- A grant is a row of `grants`, one account's, keyed by account like the counters: on Citus it is
-- distributed by account_id and co-located with accounts, so that a take that draws on it, its
-- counter and their ledger rows are on one shard. `remaining` is a cache of the ledger, as a
-- counter's `used` is: every unit that enters, leaves or comes back to a grant is a ledger row in
-- its counter's hash chain (kinds grant, grant_take, grant_release, grant_forfeit, grant_void,
-- grant_expire) naming the grant (ledger.grant_id), and remaining = units - taken + released -
-- voided - expired. The service's role only reads grants; the writers are the SECURITY DEFINER
-- functions of migrations/repeatable/grants.sql.
--
-- The ledger's new rows keep its rules: the kinds join ledger_kind (a domain on one PostgreSQL, the
-- table CHECK ledger_kind_check on Citus), and a grant's draw, return and forfeit name their take in
-- take_id as a release does (ledger_links_check / ledger_check, same number of clauses, so a take's
-- insert pays for no more rules than before). grant_id enters a row's hash as a thirteenth field,
-- only when it is set (ledger_grant_hash): every hash written before stays valid.
SET LOCAL lock_timeout = '10s';
-- On Citus, every statement of this transaction on one connection per node: it changes the ledger's
-- shards (a column) and then creates functions, which Citus propagates only over such connections.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') THEN
        PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);
    END IF;
END
$$;

CREATE TABLE grants (
    account_id  text NOT NULL,
    id          bigint GENERATED ALWAYS AS IDENTITY,
    metric      text NOT NULL,
    units       bigint NOT NULL CHECK (units > 0),
    remaining   bigint NOT NULL CHECK (remaining >= 0 AND remaining <= units),
    expires_at  timestamptz,
    source      text NOT NULL CHECK (source IN ('admin', 'stripe', 'revenuecat')),
    source_ref  text NOT NULL CHECK (char_length(source_ref) BETWEEN 1 AND 255),
    note        text CHECK (char_length(note) <= 500),
    payment_ref text,                        -- a purchase's payment (Stripe payment intent): its refunds void it
    actor       text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    voided_at   timestamptz,                 -- void: the remainder forfeited then
    voided      bigint CHECK (voided >= 0),  -- how many units the void forfeited
    expired     bigint CHECK (expired >= 0), -- how many units the expiry row recorded as expired
    PRIMARY KEY (account_id, id)
);
-- One grant per source reference and account: a redelivered purchase or a repeated admin key finds
-- the first grant (dedupe by constraint).
CREATE UNIQUE INDEX grants_source_ref ON grants (account_id, source, source_ref);
-- A refund finds the grant its payment bought (a Stripe charge names the payment intent alone).
CREATE INDEX grants_payment ON grants (payment_ref) WHERE payment_ref IS NOT NULL;
-- A take's draw order among an account's live grants of a metric (soonest expiry, none last, oldest).
CREATE INDEX grants_draw ON grants (account_id, metric, expires_at, id) WHERE remaining > 0;
-- The expiry job's scan: grants past their time whose remainder has no expiry row yet.
CREATE INDEX grants_to_expire ON grants (expires_at) WHERE expired IS NULL AND voided_at IS NULL;
GRANT SELECT ON grants TO quota_app;

ALTER TABLE ledger ADD COLUMN grant_id bigint;  -- a grant's rows: the grant (NULL on every other row)

-- The canonical message of 0009 with grant_id appended as a thirteenth field when it is set
-- (`<length>:<id>`). A row without a grant hashes exactly as ledger_hash does.
CREATE FUNCTION ledger_grant_hash(
    prev_hash bytea, id bigint, at timestamptz, account_id text, metric text, period text, kind text,
    units bigint, used_after bigint, lim bigint, take_id bigint, idempotency_key text, actor text,
    grant_id bigint
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
        octet_length(actor), ':', actor,
        CASE WHEN grant_id IS NOT NULL THEN octet_length(grant_id::text) || ':' || grant_id END), 'UTF8'))
$$;
REVOKE EXECUTE ON FUNCTION ledger_grant_hash(bytea, bigint, timestamptz, text, text, text, text, bigint, bigint,
                                             bigint, bigint, text, text, bigint) FROM PUBLIC;

DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') THEN
        PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);
        PERFORM create_distributed_table('grants', 'account_id', colocate_with => 'accounts');
        ALTER TABLE ledger DROP CONSTRAINT ledger_kind_check, DROP CONSTRAINT ledger_check;
        ALTER TABLE ledger ADD CONSTRAINT ledger_kind_check CHECK (kind IN (
            'take', 'release', 'reset', 'grant', 'grant_take', 'grant_release', 'grant_forfeit', 'grant_void',
            'grant_expire')) NOT VALID;
        ALTER TABLE ledger ADD CONSTRAINT ledger_check CHECK (
            (kind IN ('release', 'grant_take', 'grant_release', 'grant_forfeit')) = (take_id IS NOT NULL)) NOT VALID;
        ALTER TABLE ledger VALIDATE CONSTRAINT ledger_kind_check;
        ALTER TABLE ledger VALIDATE CONSTRAINT ledger_check;
    ELSE
        ALTER DOMAIN ledger_kind DROP CONSTRAINT ledger_kind_check;
        ALTER DOMAIN ledger_kind ADD CONSTRAINT ledger_kind_check CHECK (VALUE IN (
            'take', 'release', 'reset', 'grant', 'grant_take', 'grant_release', 'grant_forfeit', 'grant_void',
            'grant_expire')) NOT VALID;
        ALTER TABLE ledger DROP CONSTRAINT ledger_links_check;
        ALTER TABLE ledger ADD CONSTRAINT ledger_links_check CHECK (
            (kind IN ('release', 'grant_take', 'grant_release', 'grant_forfeit')) = (take_id IS NOT NULL)
            AND (prev_hash IS NULL) = (seq = 1)) NOT VALID;
        ALTER DOMAIN ledger_kind VALIDATE CONSTRAINT ledger_kind_check;
        ALTER TABLE ledger VALIDATE CONSTRAINT ledger_links_check;
    END IF;
END
$$;
-- As 0012 does for quotas: added after the table is distributed (both co-located on the account).
ALTER TABLE grants ADD CONSTRAINT grants_account_id_fkey FOREIGN KEY (account_id) REFERENCES accounts (id);
