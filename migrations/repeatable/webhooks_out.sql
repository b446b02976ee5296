-- The writers of webhook endpoints (events out, migrations/0027, docs/events.md). `quota-ledger
-- migrate` applies this file on every run, after the versioned migrations (service/migrate.py).
-- SECURITY DEFINER, owned by the tables' owner, search_path fixed, as the writers of
-- ledger_writers.sql: the service's role only reads webhook_endpoints, and every change to an
-- endpoint is written here with its audit row, in one call. Endpoints belong to no account: their
-- audit rows have account_id '' (as API keys' do), and never hold a secret.

-- A new endpoint (`webhook_endpoint_created`); the caller made the id and the secret.
CREATE OR REPLACE FUNCTION webhook_endpoint_create(
    p_id text, p_url text, p_events text[], p_secret text, p_actor text
) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $f$
BEGIN
    INSERT INTO webhook_endpoints (id, url, events, secret) VALUES (p_id, p_url, p_events, p_secret);
    PERFORM audit_append(p_actor, 'webhook_endpoint_created', '', NULL, 'null',
                         jsonb_build_object('id', p_id, 'url', p_url, 'events', to_jsonb(p_events)));
END
$f$;

-- Disable a live endpoint (`webhook_endpoint_disabled`, with the reason): nothing more is sent to it,
-- and its waiting deliveries are failed, so that a dead endpoint's backlog ends and is purged with
-- the retention. Deliveries a relay is sending now are skipped, not waited for: a relay holding one
-- may itself be the caller, or about to write this endpoint's row, and waiting would deadlock; the
-- relay's purge fails what is left (outbox_fail_orphans). False, and nothing written, when it is
-- deleted or disabled already.
CREATE OR REPLACE FUNCTION webhook_endpoint_disable(p_id text, p_reason text, p_actor text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $f$
BEGIN
    UPDATE webhook_endpoints e SET enabled = false, disabled_reason = p_reason
     WHERE e.id = p_id AND e.enabled AND e.deleted_at IS NULL;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE webhook_deliveries d
       SET status = 'failed', finished_at = now(), last_error = 'endpoint disabled: ' || p_reason
     WHERE d.id IN (SELECT w.id FROM webhook_deliveries w
                     WHERE w.endpoint_id = p_id AND w.status = 'pending' FOR UPDATE SKIP LOCKED);
    PERFORM audit_append(p_actor, 'webhook_endpoint_disabled', '', NULL, jsonb_build_object('enabled', true),
                         jsonb_build_object('id', p_id, 'enabled', false, 'reason', p_reason));
    RETURN true;
END
$f$;

-- Delete an endpoint (`webhook_endpoint_deleted`): the row stays, marked, for its deliveries' sake;
-- its waiting deliveries are failed (those being sent now skipped, as by webhook_endpoint_disable). NULL: no such endpoint; false: deleted already (nothing written).
CREATE OR REPLACE FUNCTION webhook_endpoint_delete(p_id text, p_actor text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $f$
DECLARE
    v_url text;
    v_events text[];
    v_deleted timestamptz;
BEGIN
    SELECT e.url, e.events, e.deleted_at INTO v_url, v_events, v_deleted
      FROM webhook_endpoints e WHERE e.id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    ELSIF v_deleted IS NOT NULL THEN
        RETURN false;
    END IF;
    -- a deleted endpoint signs nothing again: its secrets go with it (the row stays for its deliveries)
    UPDATE webhook_endpoints e
       SET deleted_at = now(), enabled = false, secret = '', previous_secret = NULL, previous_until = NULL
     WHERE e.id = p_id;
    UPDATE webhook_deliveries d
       SET status = 'failed', finished_at = now(), last_error = 'endpoint deleted'
     WHERE d.id IN (SELECT w.id FROM webhook_deliveries w
                     WHERE w.endpoint_id = p_id AND w.status = 'pending' FOR UPDATE SKIP LOCKED);
    PERFORM audit_append(p_actor, 'webhook_endpoint_deleted', '', NULL,
                         jsonb_build_object('id', p_id, 'url', v_url, 'events', to_jsonb(v_events)),
                         'null');
    RETURN true;
END
$f$;

-- A new secret for a live endpoint (`webhook_endpoint_secret_rotated`); the one it replaces still
-- signs until now() + p_grace (every delivery carries both signatures meanwhile). Returns that end;
-- NULL: no live endpoint has this id.
CREATE OR REPLACE FUNCTION webhook_endpoint_rotate(p_id text, p_secret text, p_grace interval, p_actor text)
RETURNS timestamptz
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $f$
DECLARE
    v_until timestamptz := now() + p_grace;
BEGIN
    UPDATE webhook_endpoints e
       SET previous_secret = e.secret, previous_until = v_until, secret = p_secret
     WHERE e.id = p_id AND e.deleted_at IS NULL;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    PERFORM audit_append(p_actor, 'webhook_endpoint_secret_rotated', '', NULL, 'null',
                         jsonb_build_object('id', p_id, 'previous_secret_until', v_until));
    RETURN v_until;
END
$f$;

-- What an attempt to deliver to an endpoint says about it (the relay, service/events/relay.py): a
-- success ends its run of failures; a 410 Gone (p_gone) disables it; a failure starts a run of
-- failures, or, when the run began p_failing_for ago or more, disables it. Writes the endpoint's row
-- only when that changes something, so that a healthy endpoint's deliveries never queue on it.
-- Returns the reason the endpoint was disabled by this call, else NULL.
CREATE OR REPLACE FUNCTION webhook_endpoint_attempted(
    p_id text, p_ok boolean, p_gone boolean, p_failing_for interval, p_actor text
) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $f$
DECLARE
    v_since timestamptz;
    v_reason text;
BEGIN
    IF p_ok THEN
        UPDATE webhook_endpoints e SET failing_since = NULL WHERE e.id = p_id AND e.failing_since IS NOT NULL;
        RETURN NULL;
    END IF;
    IF p_gone THEN
        v_reason := '410 Gone';
    ELSE
        SELECT e.failing_since INTO v_since FROM webhook_endpoints e WHERE e.id = p_id;
        IF v_since IS NULL THEN
            UPDATE webhook_endpoints e SET failing_since = now() WHERE e.id = p_id AND e.failing_since IS NULL;
            RETURN NULL;
        ELSIF v_since > now() - p_failing_for THEN
            RETURN NULL;
        END IF;
        v_reason := 'failing since ' || to_char(v_since AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"');
    END IF;
    IF webhook_endpoint_disable(p_id, v_reason, p_actor) THEN
        RETURN v_reason;
    END IF;
    RETURN NULL;
END
$f$;

-- Who may call what (set_function_grants, migrations/0020): the service's role the writers the API
-- and the relay call; disabling alone is the owner's (called by webhook_endpoint_attempted).
CALL set_function_grants(
    ARRAY['webhook_endpoint_create(text, text, text[], text, text)',
          'webhook_endpoint_delete(text, text)',
          'webhook_endpoint_rotate(text, text, interval, text)',
          'webhook_endpoint_attempted(text, boolean, boolean, interval, text)'],
    ARRAY['webhook_endpoint_disable(text, text, text)']
);
