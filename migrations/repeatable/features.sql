-- The writer of boolean features' overrides (account_features, migrations/0023). `quota-ledger
-- migrate` applies this file on every run, after the versioned migrations (service/migrate.py).
-- SECURITY DEFINER, owned by the tables' owner, search_path fixed, as the writers of
-- ledger_writers.sql: the override and its audit row are written by one user in one call, which
-- Citus requires of an account's co-located tables (docs/design/ledger-writers.md).

-- A feature's override set (p_enabled true or false) or cleared (p_enabled NULL), and its audit row
-- (`feature_override_set`, `feature_override_cleared`; old and new as {"enabled": bool} or null), in
-- one call (service/quota/features.py). The account's row is locked first, so of concurrent calls
-- that would change the same thing, one does and the others find it done: a call that changes
-- nothing writes nothing. The audit row's `metric` names the feature (a name is a metric's or a
-- feature's, never both: service/plans.py). Returns the previous override (NULL: none was set); no
-- row back: no such account.
CREATE OR REPLACE FUNCTION feature_set_override(
    p_account_id text, p_feature text, p_enabled boolean, p_actor text
) RETURNS TABLE (previous boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $f$
#variable_conflict use_column
DECLARE
    v_old jsonb;
    v_new jsonb := CASE WHEN p_enabled IS NULL THEN 'null' ELSE jsonb_build_object('enabled', p_enabled) END;
BEGIN
    PERFORM FROM accounts a WHERE a.id = p_account_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT f.enabled INTO previous
      FROM account_features f
     WHERE f.account_id = p_account_id AND f.feature = p_feature;
    RETURN NEXT;
    v_old := CASE WHEN previous IS NULL THEN 'null' ELSE jsonb_build_object('enabled', previous) END;
    IF v_old = v_new THEN
        RETURN;
    END IF;
    IF p_enabled IS NULL THEN
        DELETE FROM account_features f WHERE f.account_id = p_account_id AND f.feature = p_feature;
    ELSE
        INSERT INTO account_features AS f (account_id, feature, enabled)
        VALUES (p_account_id, p_feature, p_enabled)
        ON CONFLICT (account_id, feature) DO UPDATE SET enabled = EXCLUDED.enabled, set_at = EXCLUDED.set_at;
    END IF;
    PERFORM audit_append(p_actor,
                         CASE WHEN p_enabled IS NULL THEN 'feature_override_cleared' ELSE 'feature_override_set' END,
                         p_account_id, p_feature, v_old, v_new);
END
$f$;

-- Who may call it (set_function_grants, migrations/0020): the service's role.
CALL set_function_grants(ARRAY['feature_set_override(text, text, boolean, text)'], ARRAY[]::text[]);
