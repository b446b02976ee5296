-- depends: 0029.rules_read_once
-- Validates 0029's ledger_links_check against the rows written before it (the rule they were
-- written under is the same). Its own migration because VALIDATE CONSTRAINT reads the whole ledger
-- under a lock that lets takes and every other writer go on (SHARE UPDATE EXCLUSIVE), which it
-- would not do in 0029's transaction, where the constraint was swapped under an exclusive lock.
-- One PostgreSQL only, as 0029.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') THEN
        RETURN;
    END IF;
    ALTER TABLE ledger VALIDATE CONSTRAINT ledger_links_check;
END
$$;
