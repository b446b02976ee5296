-- depends: 0022.periods_of_every_kind
-- Boolean features' sticky admin overrides (service/quota/features.py), one row per account and
-- feature that an admin set; no row: the plan decides. A plan's features are the plan config's, never
-- stored, so a tier change, a plan sync or a reset has nothing here to touch: an override survives
-- them by construction.
--
-- Keyed by account, like quotas: on Citus it is distributed by account_id and co-located with
-- accounts (0012), so that an override and its audit row are written on one shard, by one user, in
-- one call (feature_set_override, migrations/repeatable/features.sql). The service's role reads it;
-- it writes it only through that function.
CREATE TABLE account_features (
    account_id text NOT NULL,
    feature    text NOT NULL CHECK (feature ~ '^.{1,64}$'),
    enabled    boolean NOT NULL,
    set_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, feature)
);
GRANT SELECT ON account_features TO quota_app;

DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') THEN
        PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);
        PERFORM create_distributed_table('account_features', 'account_id', colocate_with => 'accounts');
    END IF;
END
$$;
-- As 0012 does for quotas: added after the table is distributed (both co-located on the account).
ALTER TABLE account_features
    ADD CONSTRAINT account_features_account_id_fkey FOREIGN KEY (account_id) REFERENCES accounts (id);
