-- depends: 0018.inbox_retention
-- Who may call the functions of migrations/repeatable/ (docs/design/ledger-writers.md): each file
-- ends with a call of this procedure that names the functions the service's role calls (EXECUTE
-- for quota_app) and those that are the owner's alone (called by the others, as the owner). The
-- rest keep PostgreSQL's default, EXECUTE for everyone: they run with their caller's privileges.
CREATE PROCEDURE set_function_grants(p_service text[], p_owner text[])
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
    fn text;
BEGIN
    FOREACH fn IN ARRAY p_service || p_owner LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC, quota_app', fn);
    END LOOP;
    FOREACH fn IN ARRAY p_service LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO quota_app', fn);
    END LOOP;
END
$$;
REVOKE ALL ON PROCEDURE set_function_grants(text[], text[]) FROM PUBLIC;
