-- depends: 0015.chain_seq
-- The webhook inbox's retention (docs/design/billing.md "Inbox retention", service/billing/inbox.py),
-- and the old names of the quota-limit rules dropped (they moved to migrations/repeatable/
-- quota_limits.sql under names that say what they do).
--
-- webhook_events_purged counts what the inbox no longer holds, per provider, status and reason:
-- `retention` (an ignored event past INBOX_IGNORED_DAYS, an applied one past INBOX_APPLIED_DAYS)
-- and `over_bound` (the oldest unmatched events of a provider beyond INBOX_UNMATCHED_LIMIT). So
-- nothing a provider sent leaves without a trace: `quota-ledger inbox stats` shows the counts, and
-- the log names each event id dropped over the bound.
-- webhook_events_ignored lets the purge find ignored rows without walking the applied ones it keeps.
-- Creating it reads the table once under a lock that keeps writes out: deliveries wait meanwhile.

DROP FUNCTION IF EXISTS quotas_follow_plan(text, text, boolean, text, text, text[], text[], bigint[]);
DROP FUNCTION IF EXISTS quotas_follow_targets(text[], text[], bigint[], bigint[], boolean[], text);
DROP FUNCTION IF EXISTS quotas_follow_account(text, text[], bigint[], bigint[], boolean[], text);

CREATE TABLE webhook_events_purged (
    provider      billing_provider NOT NULL,
    status        inbox_status NOT NULL,
    reason        text NOT NULL CHECK (reason IN ('retention', 'over_bound')),
    events        bigint NOT NULL CHECK (events >= 0),
    last_event_id text,             -- an event id of the latest removal, for support
    last_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, status, reason)
);
GRANT SELECT, INSERT, UPDATE ON webhook_events_purged TO quota_app;
GRANT DELETE ON webhook_events TO quota_app;
CREATE INDEX webhook_events_ignored ON webhook_events (id) WHERE status = 'ignored';

DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') THEN
        -- A copy on every node, like the inbox it counts (0012).
        PERFORM create_reference_table('webhook_events_purged');
    END IF;
END
$$;
