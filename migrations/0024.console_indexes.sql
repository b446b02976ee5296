-- depends: 0023.account_features
-- transactional: false
-- Two indexes for reads of one account (issue 27), both built CONCURRENTLY (below).
--
-- ledger_history: an account's ledger rows of one metric in time order: the index behind the usage history
-- (GET /v1/accounts/{id}/usage/history, service/quota/history.sql) and the console's plots, which
-- read one account's rows of one metric between two days, and the last row before the first day.
-- No index held that: ledger_chain_seq (account_id, metric, seq) orders the same rows but cannot
-- find a time in them, so a range of days read every row the metric ever had (100,000 rows for a
-- busy account, bench/history_bench.py).
--
-- What it costs: one more index entry per ledger row on every take and release (the ledger had
-- five indexes; this is its sixth), about 40 bytes a row plus the account id and metric names
-- (some 5 GB per 100 million rows); the ledger is append-only and time-ordered per counter, so
-- entries are added at the right end of each (account, metric) run and pages fill well.
--
-- CONCURRENTLY: a ledger of millions of rows would otherwise be locked against every take while
-- the index is built. It cannot run in a transaction, hence `transactional: false` above. A build
-- that is interrupted leaves an invalid index of this name; `DROP INDEX CONCURRENTLY
-- ledger_history;` then migrate again (likewise webhook_events_account). On Citus each statement is
-- propagated to every shard (ledger) and every node's copy (webhook_events, a reference table).
CREATE INDEX CONCURRENTLY IF NOT EXISTS ledger_history ON ledger (account_id, metric, at);

-- webhook_events_account: the latest provider events resolved to an account, for the console's
-- account page ("why this plan", service/billing/standing.sql). Without it that read walks the whole
-- inbox backwards for an account with few or no events (most accounts). Only rows with an account
-- (applied, ignored or failed after resolving); unmatched ones are found by webhook_events_waiting_names
-- (0008). A delivery writes one more index entry when it resolves its account: deliveries are few
-- next to takes.
CREATE INDEX CONCURRENTLY IF NOT EXISTS webhook_events_account ON webhook_events (account_id, id)
    WHERE account_id IS NOT NULL;
