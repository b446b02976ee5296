-- depends: 0024.ledger_history
-- transactional: false
-- webhook_events_account (issue 27): the latest provider events resolved to an account, for the
-- console's account page ("why this plan", service/billing/standing.sql). Without it that read
-- walks the whole inbox backwards for an account with few or no events (most accounts). Only rows
-- with an account (applied, ignored or failed after resolving); unmatched ones are found by
-- webhook_events_waiting_names (0008). A delivery writes one more index entry when it resolves its account: deliveries are few
-- next to takes.
--
-- Built CONCURRENTLY, outside a transaction, for the reasons 0024 gives (an interrupted build: `DROP
-- INDEX CONCURRENTLY webhook_events_account;`, then migrate again). On Citus webhook_events is a
-- reference table: the statement is propagated to every node's copy.
CREATE INDEX CONCURRENTLY webhook_events_account ON webhook_events (account_id, id)
    WHERE account_id IS NOT NULL;
