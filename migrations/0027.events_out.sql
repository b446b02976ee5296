-- depends: 0026.grants
-- Events out (issue 26, docs/events.md): what the service tells product services, produced in the
-- transaction that caused it and delivered afterwards by `quota-ledger relay`.
--
-- * event_outbox: one row per event, written by the definer function that made the change (a take
--   crossing a threshold, a tier or status change, a grant made or voided), in the same
--   transaction: a rolled-back change leaves no event, a committed one cannot lose it. Keyed by
--   account like the counters: on Citus it is distributed by account_id and co-located with
--   accounts, so the take's insert stays on the take's shard. The service's role reads it and marks
--   rows fanned out; it cannot write an event.
-- * webhook_endpoints, webhook_deliveries: where events go, and one row per (event, endpoint) with
--   its attempts. The relay fans an outbox row out into deliveries, then claims due deliveries with
--   FOR UPDATE SKIP LOCKED. Plain tables (on Citus: the coordinator's own), since nothing on a
--   worker reads them. Endpoints are written only by definer functions, which write their audit rows.
-- * plan_thresholds: each plan's thresholds (percent of the effective limit), copied from the plan
--   file by the plan sync; read only when a take reaches its counter's alert line (below).
-- * quotas.alerted / alert_pct: the highest threshold fired in the counter's period, and the percent
--   at which the next take must look at the thresholds (NULL: none left). The take compares
--   `used * 100 >= alert_pct * lim` on the row it already holds; only then does it read the
--   thresholds. 1 means "look at the first take": the period opened, the plan may have changed.
SET LOCAL lock_timeout = '10s';
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') THEN
        PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);
    END IF;
END
$$;

CREATE TABLE event_outbox (
    account_id  text NOT NULL,
    id          bigint GENERATED ALWAYS AS IDENTITY,
    type        text NOT NULL CHECK (type IN ('quota.threshold_crossed', 'account.plan_changed', 'credits.granted',
                                              'credits.voided')),
    data        jsonb NOT NULL,
    occurred_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    fanned_out  boolean NOT NULL DEFAULT false,
    PRIMARY KEY (account_id, id)
);
-- The relay's scan: rows not fanned out yet, whatever order they committed in (no id cursor).
CREATE INDEX event_outbox_to_fan_out ON event_outbox (id) WHERE NOT fanned_out;
-- The purge: fanned-out rows by age.
CREATE INDEX event_outbox_fanned ON event_outbox (occurred_at) WHERE fanned_out;
GRANT SELECT, DELETE ON event_outbox TO quota_app;
GRANT UPDATE (fanned_out) ON event_outbox TO quota_app;

CREATE TABLE plan_thresholds (
    plan       text PRIMARY KEY,
    thresholds smallint[] NOT NULL CHECK (1 <= ALL (thresholds) AND 100 >= ALL (thresholds))
);
GRANT SELECT, INSERT, UPDATE, DELETE ON plan_thresholds TO quota_app;

ALTER TABLE quotas ADD COLUMN alerted smallint NOT NULL DEFAULT 0,
                   ADD COLUMN alert_pct smallint DEFAULT 1;

CREATE TABLE webhook_endpoints (
    id                    text PRIMARY KEY,          -- we_<random>
    url                   text NOT NULL CHECK (char_length(url) <= 2048),
    events                text[] NOT NULL,
    enabled               boolean NOT NULL DEFAULT true,
    secret                text NOT NULL,             -- whsec_<base64 of >= 24 random bytes>
    previous_secret       text,                      -- still signed with until previous_until (rotation)
    previous_until        timestamptz,
    failing_since         timestamptz,               -- first failure of the current run of failures
    disabled_reason       text,
    created_at            timestamptz NOT NULL DEFAULT now(),
    deleted_at            timestamptz
);
GRANT SELECT ON webhook_endpoints TO quota_app;

CREATE TABLE webhook_deliveries (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    endpoint_id     text NOT NULL REFERENCES webhook_endpoints (id),
    event_id        bigint NOT NULL,                 -- event_outbox.id; webhook-id is evt_<event_id>
    account_id      text NOT NULL,
    type            text NOT NULL,
    body            text NOT NULL,                   -- the exact bytes sent, the same on every attempt
    occurred_at     timestamptz NOT NULL,
    status          text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_status     integer,                         -- the HTTP status of the last attempt, if any
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    UNIQUE (event_id, endpoint_id)                   -- a second fan-out of an event adds nothing
);
-- The relay's claim: due pending deliveries, soonest first.
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
-- An endpoint's deliveries, newest first (the admin list), and the purge by age.
CREATE INDEX webhook_deliveries_by_endpoint ON webhook_deliveries (endpoint_id, id DESC);
CREATE INDEX webhook_deliveries_finished ON webhook_deliveries (finished_at) WHERE status <> 'pending';
GRANT SELECT, INSERT, UPDATE, DELETE ON webhook_deliveries TO quota_app;

DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') THEN
        PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);
        PERFORM create_distributed_table('event_outbox', 'account_id', colocate_with => 'accounts');
        PERFORM create_reference_table('plan_thresholds');
    END IF;
END
$$;
