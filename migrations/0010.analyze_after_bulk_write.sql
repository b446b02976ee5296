-- depends: 0006.quotas_follow_plan
-- Fresh statistics after a bulk job, for the role the workers run as.
--
-- A monthly reset moves every counter into the new period and writes a reset ledger row for most
-- of them within minutes; until autovacuum's next ANALYZE the planner still believes the new period
-- holds a handful of rows, and a cross-account query of it (reconciliation, finance pages) gets a
-- plan sized for that, one that grows with the square of the period's rows (see
-- tests/db/test_plans_after_bulk_writes.py). The
-- job therefore analyzes what it wrote when it finishes. ANALYZE needs the table's owner, and the
-- service runs as a member of quota_app, so the owner lends it this one function. search_path is
-- fixed at creation (as for any SECURITY DEFINER function), so a caller cannot redirect the names.
CREATE FUNCTION analyze_after_bulk_write() RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    ANALYZE quotas;
    ANALYZE ledger;
END
$$;

REVOKE ALL ON FUNCTION analyze_after_bulk_write() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION analyze_after_bulk_write() TO quota_app;
