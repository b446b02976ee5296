-- The writers of credits (grants, migrations/0024; README "Credits"; docs/ledger.md "Grants in the
-- ledger"). `quota-ledger migrate` applies this file on every run, after the versioned migrations.
-- SECURITY DEFINER, owned by the tables' owner, search_path fixed, as the writers of
-- ledger_writers.sql. Every unit that enters, leaves or comes back to a grant is a ledger row in its
-- counter's chain, naming the grant (grant_id, hashed as a thirteenth field). A grant's rows leave
-- the counter's `used` as it was (their used_after is the counter's), so the counter = ledger rule
-- reads them as nothing; a grant's remaining = units - taken + released - voided - expired.
--
-- Lock order, everywhere: the counter's row first, then its grants' rows in id order. Every writer
-- of a grant locks its counter first, so the counter's lock alone orders them; the grants' locks
-- keep a writer that forgot from racing.
--
-- None of this is on a take's fast path: ledger_take runs as before, and only when it refuses for
-- want of room does the service call ledger_take_credits (service/quota/takes.py).

-- The next link of a counter's chain for a row naming a grant: ledger_link with the grant's id hashed
-- as the thirteenth field (ledger_grant_hash). Inlined into the caller's SET as ledger_link is.
CREATE OR REPLACE FUNCTION ledger_grant_link(
    head_seq bigint, head_hash bytea, account_id text, metric text, period text, kind text, units bigint,
    used_after bigint, take_id bigint, actor text, grant_id bigint
) RETURNS TABLE (seq bigint, prev_hash bytea, id bigint, at timestamptz, hash bytea)
LANGUAGE sql STABLE AS $$
    SELECT head_seq + 1, head_hash, e.id, e.at,
           ledger_grant_hash(head_hash, e.id, e.at, account_id, metric, period, kind, units, used_after, NULL,
                             take_id, NULL, actor, grant_id)
      FROM (SELECT nextval('ledger_id_seq') AS id, clock_timestamp() AS at) AS e
$$;

-- One row of a grant in its counter's chain (kind grant, grant_take, grant_release, grant_forfeit,
-- grant_void, grant_expire): the head moved, the row inserted, in the counter's current period, the
-- counter's used unchanged. The caller holds the counter's row lock. Returns the row's id.
CREATE OR REPLACE FUNCTION grant_append(
    p_account_id text, p_metric text, p_kind text, p_units bigint, p_take_id bigint, p_grant_id bigint,
    p_actor text
) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $f$
DECLARE
    v_id bigint;
BEGIN
    WITH head AS (
        UPDATE quotas q
           SET (chain_seq, chain_prev, chain_id, chain_at, chain_hash) = (
                   SELECT * FROM ledger_grant_link(q.chain_seq, q.chain_hash, q.account_id, q.metric, q.period,
                                                   p_kind, p_units, q.used, p_take_id, p_actor, p_grant_id))
         WHERE q.account_id = p_account_id AND q.metric = p_metric
     RETURNING q.account_id, q.metric, q.period, q.used, q.chain_id, q.chain_at, q.chain_seq, q.chain_prev,
               q.chain_hash
    )
    INSERT INTO ledger (id, at, seq, account_id, metric, period, kind, units, used_after, take_id, actor,
                        prev_hash, hash, grant_id)
    OVERRIDING SYSTEM VALUE
    SELECT h.chain_id, h.chain_at, h.chain_seq, h.account_id, h.metric, h.period, p_kind, p_units, h.used,
           p_take_id, p_actor, h.chain_prev, h.chain_hash, p_grant_id
      FROM head h
    RETURNING ledger.id INTO v_id;
    IF v_id IS NULL THEN
        RAISE EXCEPTION 'no counter % of account % to chain a grant''s row on', p_metric, p_account_id;
    END IF;
    RETURN v_id;
END
$f$;

-- A grant created (service/quota/grants.py), with its `grant` ledger row and its audit row
-- (`grant_created`), in one call; or, when the account already has a grant of this source and
-- reference (a repeated idempotency key, a redelivered purchase), that grant and nothing written
-- (`created` false). The counter must exist (the caller ensures it); no row back: it does not.
CREATE OR REPLACE FUNCTION grant_create(
    p_account_id text, p_metric text, p_units bigint, p_expires_at timestamptz, p_source text,
    p_source_ref text, p_note text, p_actor text, p_payment_ref text
) RETURNS TABLE (created boolean, grant_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $f$
#variable_conflict use_column
BEGIN
    PERFORM FROM quotas q WHERE q.account_id = p_account_id AND q.metric = p_metric FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    INSERT INTO grants AS g (account_id, metric, units, remaining, expires_at, source, source_ref, note, actor,
                             payment_ref)
    VALUES (p_account_id, p_metric, p_units, p_units, p_expires_at, p_source, p_source_ref, p_note, p_actor,
            p_payment_ref)
    ON CONFLICT (account_id, source, source_ref) DO NOTHING
    RETURNING g.id INTO grant_id;
    IF grant_id IS NULL THEN
        created := false;
        SELECT g.id INTO grant_id FROM grants g
         WHERE g.account_id = p_account_id AND g.source = p_source AND g.source_ref = p_source_ref;
        RETURN NEXT;
        RETURN;
    END IF;
    created := true;
    PERFORM grant_append(p_account_id, p_metric, 'grant', p_units, NULL, grant_id, p_actor);
    PERFORM audit_append(p_actor, 'grant_created', p_account_id, p_metric, 'null',
                         jsonb_build_object('grant_id', grant_id, 'units', p_units, 'expires_at', p_expires_at,
                                            'source', p_source, 'source_ref', p_source_ref));
    PERFORM event_emit(p_account_id, 'credits.granted', jsonb_build_object(
        'account_id', p_account_id, 'metric', p_metric, 'grant_id', grant_id, 'units', p_units,
        'source', p_source, 'expires_at', event_time(p_expires_at)));
    RETURN NEXT;
END
$f$;

-- A grant voided, forward-only: its remainder forfeited now (a `grant_void` row of that many units),
-- what takes already drew stays drawn, and a later release of such a draw is forfeited too. A grant
-- voided before is answered as it was and nothing is written. p_units NULL: the whole remainder;
-- else at most that many (a partial refund). `used`: units drawn and not given back. No row back:
-- no such grant.
CREATE OR REPLACE FUNCTION grant_void(p_account_id text, p_grant_id bigint, p_units bigint, p_actor text)
RETURNS TABLE (voided bigint, used bigint, changed boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $f$
#variable_conflict use_column
DECLARE
    g record;
    v_now bigint;
    v_at timestamptz := clock_timestamp();  -- a value, not a call, in the UPDATE: Citus refuses a
                                            -- volatile function in an UPDATE of a distributed table
BEGIN
    SELECT gr.metric INTO g FROM grants gr WHERE gr.account_id = p_account_id AND gr.id = p_grant_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM FROM quotas q WHERE q.account_id = p_account_id AND q.metric = g.metric FOR UPDATE;
    SELECT gr.* INTO g FROM grants gr WHERE gr.account_id = p_account_id AND gr.id = p_grant_id FOR UPDATE;
    v_now := least(g.remaining, coalesce(p_units, g.remaining));
    -- voided before; or a partial void with nothing left to void (a full void of a grant drawn to
    -- nothing still ends it, with a row of 0 units: a later release of its draws is forfeited)
    IF g.voided_at IS NOT NULL OR (p_units IS NOT NULL AND v_now = 0) THEN
        voided := coalesce(g.voided, 0); used := g.units - g.remaining - voided - coalesce(g.expired, 0);
        changed := false;
        RETURN NEXT;
        RETURN;
    END IF;
    UPDATE grants gr
       SET remaining = gr.remaining - v_now, voided = coalesce(gr.voided, 0) + v_now,
           voided_at = CASE WHEN p_units IS NULL OR gr.remaining = v_now THEN v_at END
     WHERE gr.account_id = p_account_id AND gr.id = p_grant_id
    RETURNING gr.voided, gr.units - gr.remaining - gr.voided - coalesce(gr.expired, 0) INTO voided, used;
    PERFORM grant_append(p_account_id, g.metric, 'grant_void', v_now, NULL, p_grant_id, p_actor);
    PERFORM audit_append(p_actor, 'grant_voided', p_account_id, g.metric,
                         jsonb_build_object('grant_id', p_grant_id, 'remaining', g.remaining),
                         jsonb_build_object('grant_id', p_grant_id, 'remaining', g.remaining - v_now,
                                            'voided', v_now));
    PERFORM event_emit(p_account_id, 'credits.voided', jsonb_build_object(
        'account_id', p_account_id, 'metric', g.metric, 'grant_id', p_grant_id, 'units', v_now,
        'remaining', g.remaining - v_now));
    changed := true;
    RETURN NEXT;
END
$f$;

-- The expiry row of a grant past its expires_at (the expiry job, service/quota/grants.py): its
-- remainder written off in a `grant_expire` row, once. Takes and reads already ignore a grant past its
-- time; this row is for the ledger's account of it. False: not due, voided, or expired already.
CREATE OR REPLACE FUNCTION grant_expire(p_account_id text, p_grant_id bigint, p_actor text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $f$
DECLARE
    g record;
BEGIN
    SELECT gr.metric INTO g FROM grants gr WHERE gr.account_id = p_account_id AND gr.id = p_grant_id;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM FROM quotas q WHERE q.account_id = p_account_id AND q.metric = g.metric FOR UPDATE;
    SELECT gr.* INTO g FROM grants gr WHERE gr.account_id = p_account_id AND gr.id = p_grant_id FOR UPDATE;
    IF g.expires_at IS NULL OR g.expires_at > now() OR g.expired IS NOT NULL OR g.voided_at IS NOT NULL THEN
        RETURN false;
    END IF;
    UPDATE grants gr SET remaining = 0, expired = g.remaining
     WHERE gr.account_id = p_account_id AND gr.id = p_grant_id;
    PERFORM grant_append(p_account_id, g.metric, 'grant_expire', g.remaining, NULL, p_grant_id, p_actor);
    RETURN true;
END
$f$;

-- A take that the allowance alone cannot cover (service/quota/takes.py, after ledger_take or
-- ledger_take_lines refused it for want of room): every line drawn from its counter's allowance
-- first, then from the account's live grants of its metric, soonest expires_at first (none last),
-- then oldest; every line or none. Lines as in ledger_take_lines (parallel arrays, distinct metrics;
-- one line: a single take, keyed by the key itself). The counters are locked in metric order, then
-- the grants in id order; each statement after a lock reads the newest committed rows (READ
-- COMMITTED), so no two takes draw the same unit. Each line writes its `take` row (the allowance's
-- share, maybe 0, keyed as any take, so a repeated key raises a unique violation that undoes the
-- whole call) and then one `grant_take` row per grant it drew on, naming the take: consecutive in the
-- counter's chain, which is how a release finds them. No row back: some line does not fit, or its
-- counter is not ready (missing, deleted, in another period): nothing changed, the caller says why.
CREATE OR REPLACE FUNCTION ledger_take_credits(
    p_account_id text, p_metrics text[], p_units bigint[], p_periods text[], p_idempotency_key text,
    p_actor text
) RETURNS TABLE (take_id bigint, metric text, units bigint, used bigint, "limit" bigint, period text,
                 limit_source text, from_credits bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $f$
#variable_conflict use_column
DECLARE
    v_n integer := cardinality(p_metrics);
    v_order integer[];
    v_share bigint[] := array_fill(0::bigint, ARRAY[v_n]);
    v_need bigint[] := array_fill(0::bigint, ARRAY[v_n]);
    v_take bigint[] := array_fill(NULL::bigint, ARRAY[v_n]);
    v_used bigint[] := array_fill(NULL::bigint, ARRAY[v_n]);
    v_lim bigint[] := array_fill(NULL::bigint, ARRAY[v_n]);
    v_source text[] := array_fill(NULL::text, ARRAY[v_n]);
    v_period text[] := array_fill(NULL::text, ARRAY[v_n]);
    v_draw_line integer[] := '{}';
    v_draw_grant bigint[] := '{}';
    v_draw_units bigint[] := '{}';
    v_left bigint;
    v_got bigint;
    c record;
    gr record;
    t record;
    i integer;
    k integer;
BEGIN
    SELECT array_agg(l.o::integer ORDER BY l.m COLLATE "C") INTO v_order
      FROM unnest(p_metrics) WITH ORDINALITY AS l(m, o);
    PERFORM FROM quotas q
      WHERE q.account_id = p_account_id AND q.metric = ANY(p_metrics)
      ORDER BY q.metric COLLATE "C"
        FOR NO KEY UPDATE;
    FOREACH i IN ARRAY v_order LOOP
        SELECT q.period, q.used, q.lim, q.account_deleted INTO c
          FROM quotas q WHERE q.account_id = p_account_id AND q.metric = p_metrics[i];
        IF NOT FOUND OR c.period <> p_periods[i] OR c.account_deleted THEN
            RETURN;
        END IF;
        v_share[i] := CASE WHEN c.lim IS NULL THEN p_units[i]
                           ELSE greatest(least(p_units[i], c.lim - c.used), 0) END;
        v_need[i] := p_units[i] - v_share[i];
    END LOOP;
    PERFORM FROM grants g
      WHERE g.account_id = p_account_id AND g.metric = ANY(p_metrics) AND g.remaining > 0
      ORDER BY g.id
        FOR NO KEY UPDATE;
    FOREACH i IN ARRAY v_order LOOP
        v_left := v_need[i];
        CONTINUE WHEN v_left = 0;
        FOR gr IN
            SELECT g.id, g.remaining FROM grants g
             WHERE g.account_id = p_account_id AND g.metric = p_metrics[i] AND g.remaining > 0
               AND g.voided_at IS NULL AND (g.expires_at IS NULL OR g.expires_at > now())
             ORDER BY g.expires_at NULLS LAST, g.created_at, g.id
        LOOP
            v_got := least(v_left, gr.remaining);
            v_draw_line := v_draw_line || i;
            v_draw_grant := v_draw_grant || gr.id;
            v_draw_units := v_draw_units || v_got;
            v_left := v_left - v_got;
            EXIT WHEN v_left = 0;
        END LOOP;
        IF v_left > 0 THEN
            RETURN;  -- this line does not fit even with every live grant: nothing is taken
        END IF;
    END LOOP;
    k := 0;
    FOREACH i IN ARRAY v_order LOOP
        k := k + 1;
        WITH granted AS (
            UPDATE quotas q
               SET used = q.used + v_share[i],
                   (chain_seq, chain_prev, chain_id, chain_at, chain_hash) = (
                       SELECT * FROM ledger_link(q.chain_seq, q.chain_hash, q.account_id, q.metric, q.period,
                                                 'take', v_share[i], q.used + v_share[i], q.lim, NULL,
                                                 take_line_key(p_idempotency_key, k), p_actor))
             WHERE q.account_id = p_account_id AND q.metric = p_metrics[i]
         RETURNING q.account_id, q.metric, q.period, q.used, q.lim, q.limit_source, q.chain_id, q.chain_at,
                   q.chain_seq, q.chain_prev, q.chain_hash
        )
        INSERT INTO ledger (id, at, seq, account_id, metric, period, kind, units, used_after, lim, limit_source,
                            idempotency_key, actor, prev_hash, hash)
        OVERRIDING SYSTEM VALUE
        SELECT g.chain_id, g.chain_at, g.chain_seq, g.account_id, g.metric, g.period, 'take', v_share[i], g.used,
               g.lim, g.limit_source, take_line_key(p_idempotency_key, k), p_actor, g.chain_prev, g.chain_hash
          FROM granted g
        RETURNING ledger.id, ledger.used_after, ledger.lim, ledger.limit_source, ledger.period INTO t;
        v_take[i] := t.id; v_used[i] := t.used_after; v_lim[i] := t.lim; v_source[i] := t.limit_source;
        v_period[i] := t.period;
        FOR j IN 1 .. coalesce(cardinality(v_draw_line), 0) LOOP
            CONTINUE WHEN v_draw_line[j] <> i;
            UPDATE grants g SET remaining = g.remaining - v_draw_units[j]
             WHERE g.account_id = p_account_id AND g.id = v_draw_grant[j];
            PERFORM grant_append(p_account_id, p_metrics[i], 'grant_take', v_draw_units[j], v_take[i],
                                 v_draw_grant[j], p_actor);
        END LOOP;
    END LOOP;
    PERFORM quota_alerts(p_account_id, p_metrics);
    RETURN QUERY
    SELECT v_take[n], p_metrics[n], p_units[n], v_used[n], v_lim[n], v_period[n], v_source[n], v_need[n]
      FROM generate_series(1, v_n) AS n;
END
$f$;

-- Before a release (ledger_release): a take that drew on grants gives their units back first, newest
-- draw first, each to its grant if that grant is still live, else forfeited (a `grant_forfeit` row:
-- the grant was voided or is past its time). Only a take whose allowance share filled its counter to
-- the limit can have drawn (the cheap test first), and its draws follow its row in the chain. Does
-- nothing when the take is not one to release now (unknown, another period, released already): the
-- release statement after it refuses. The counter is locked first, so of two releases of one take
-- one finds the other's release row. Returns the units given back to grants.
CREATE OR REPLACE FUNCTION grant_release_draws(p_account_id text, p_take_id bigint, p_period text, p_actor text)
RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $f$
DECLARE
    t record;
    d record;
    v_grants bigint[] := '{}';
    v_units bigint[] := '{}';
    v_live boolean;
    v_back bigint := 0;
    n integer := 1;
BEGIN
    SELECT l.metric, l.seq, l.period INTO t
      FROM ledger l
     WHERE l.account_id = p_account_id AND l.id = p_take_id AND l.kind = 'take'
       AND l.period IN (p_period, left(p_period, 7), 'held') AND l.used_after >= l.lim;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    LOOP
        SELECT l.grant_id, l.units INTO d
          FROM ledger l
         WHERE l.account_id = p_account_id AND l.metric = t.metric AND l.seq = t.seq + n
           AND l.kind = 'grant_take' AND l.take_id = p_take_id;
        EXIT WHEN NOT FOUND;
        v_grants := v_grants || d.grant_id;
        v_units := v_units || d.units;
        n := n + 1;
    END LOOP;
    IF cardinality(v_grants) = 0 THEN
        RETURN 0;
    END IF;
    PERFORM FROM quotas q
      WHERE q.account_id = p_account_id AND q.metric = t.metric AND q.period = t.period
        FOR UPDATE;
    IF NOT FOUND OR EXISTS (SELECT FROM ledger r
                             WHERE r.account_id = p_account_id AND r.kind = 'release' AND r.take_id = p_take_id)
    THEN
        RETURN 0;
    END IF;
    PERFORM FROM grants g WHERE g.account_id = p_account_id AND g.id = ANY(v_grants) ORDER BY g.id FOR NO KEY UPDATE;
    FOR k IN REVERSE cardinality(v_grants) .. 1 LOOP
        SELECT g.voided_at IS NULL AND g.expired IS NULL AND (g.expires_at IS NULL OR g.expires_at > now())
          INTO v_live
          FROM grants g WHERE g.account_id = p_account_id AND g.id = v_grants[k];
        IF v_live THEN
            UPDATE grants g SET remaining = g.remaining + v_units[k]
             WHERE g.account_id = p_account_id AND g.id = v_grants[k];
            PERFORM grant_append(p_account_id, t.metric, 'grant_release', v_units[k], p_take_id, v_grants[k],
                                 p_actor);
            v_back := v_back + v_units[k];
        ELSE
            PERFORM grant_append(p_account_id, t.metric, 'grant_forfeit', v_units[k], p_take_id, v_grants[k],
                                 p_actor);
        END IF;
    END LOOP;
    RETURN v_back;
END
$f$;

-- The live grants: what credits are. A grant past its time, voided or drawn to nothing counts
-- nothing, whether or not the expiry job has run. A view, not a function, so that the reads that
-- join it to an account's counters (takes.sql `take_refusal`, accounts.sql `account_quotas`,
-- grants.sql `grant_credits`) stay one query that Citus routes to the account's shard: a function
-- that reads a distributed table, called inside a query Citus pushes to a shard, is a nested
-- distributed query, which Citus refuses.
CREATE OR REPLACE VIEW live_grants AS
    SELECT g.account_id, g.metric, g.id, g.remaining, g.expires_at, g.created_at
      FROM grants g
     WHERE g.remaining > 0 AND g.voided_at IS NULL AND (g.expires_at IS NULL OR g.expires_at > now());
GRANT SELECT ON live_grants TO quota_app;

-- What the account's live grants of a metric have left: its credits, for the writers (one
-- PostgreSQL's batch, ledger_writers.sql `ledger_take_each`).
CREATE OR REPLACE FUNCTION grant_credits(p_account_id text, p_metric text) RETURNS bigint
LANGUAGE sql STABLE SET search_path = pg_catalog, public, pg_temp AS $$
    SELECT coalesce(sum(lg.remaining), 0)::bigint
      FROM live_grants lg
     WHERE lg.account_id = p_account_id AND lg.metric = p_metric
$$;

-- The release of a take that drew on grants (takes.py `release`, after ledger_release left it
-- alone for that reason): first grant_release_draws gives each draw back to its grant, newest first
-- (or forfeits it), then the allowance's share is given back as ledger_release gives it (at most what
-- the counter holds; once, by the unique index on release rows; only in the take's period). The
-- answer is ledger_release's, its units counting what went back to grants. No row back: the take is
-- released already, or its period is closed (the caller asks why, as after ledger_release).
CREATE OR REPLACE FUNCTION ledger_release_credits(
    p_account_id text, p_take_id bigint, p_period text, p_actor text
) RETURNS TABLE (released boolean, take_id bigint, account_id text, metric text, units bigint, used bigint,
                 "limit" bigint, period text, limit_source text, release_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $f$
#variable_conflict use_column
DECLARE
    v_back bigint;
    v_held bigint;
    v_units bigint;
    t record;
    r record;
BEGIN
    v_back := grant_release_draws(p_account_id, p_take_id, p_period, p_actor);
    SELECT l.metric, l.units, l.period INTO t
      FROM ledger l
     WHERE l.account_id = p_account_id AND l.id = p_take_id AND l.kind = 'take'
       AND l.period IN (p_period, left(p_period, 7), 'held')
       AND NOT EXISTS (SELECT 1 FROM ledger x
                        WHERE x.account_id = p_account_id AND x.kind = 'release' AND x.take_id = l.id);
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT q.used INTO v_held
      FROM quotas q
     WHERE q.account_id = p_account_id AND q.metric = t.metric AND q.period = t.period
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;  -- the take's period is closed: nothing is given back
    END IF;
    v_units := least(t.units, v_held);
    WITH given AS (
        UPDATE quotas q
           SET used = q.used - v_units,
               (chain_seq, chain_prev, chain_id, chain_at, chain_hash) = (
                   SELECT * FROM ledger_link(q.chain_seq, q.chain_hash, q.account_id, q.metric, q.period, 'release',
                                             v_units, q.used - v_units, NULL, p_take_id, NULL, p_actor))
         WHERE q.account_id = p_account_id AND q.metric = t.metric
     RETURNING q.account_id, q.metric, q.period, q.used, q.lim, q.limit_source, q.chain_id, q.chain_at, q.chain_seq,
               q.chain_prev, q.chain_hash
    ), entry AS (
        INSERT INTO ledger (id, at, seq, account_id, metric, period, kind, units, used_after, take_id, actor,
                            prev_hash, hash)
        OVERRIDING SYSTEM VALUE
        SELECT g.chain_id, g.chain_at, g.chain_seq, g.account_id, g.metric, g.period, 'release', v_units, g.used,
               p_take_id, p_actor, g.chain_prev, g.chain_hash
          FROM given g
     RETURNING ledger.id
    )
    SELECT g.account_id, g.metric, g.used, g.lim, g.period, g.limit_source, (SELECT e.id FROM entry e) AS id
      INTO r
      FROM given g;
    released := true; take_id := p_take_id; account_id := r.account_id; metric := r.metric;
    units := v_units + v_back; used := r.used; "limit" := r.lim; period := r.period;
    limit_source := r.limit_source; release_id := r.id;
    RETURN NEXT;
END
$f$;

-- Who may call what (set_function_grants, migrations/0020): the service's role the writers it calls;
-- the link and the row append are the owner's alone.
CALL set_function_grants(
    ARRAY['grant_create(text, text, bigint, timestamptz, text, text, text, text, text)',
          'grant_void(text, bigint, bigint, text)',
          'grant_expire(text, bigint, text)',
          'ledger_take_credits(text, text[], bigint[], text[], text, text)',
          'grant_credits(text, text)',
          'ledger_release_credits(text, bigint, text, text)'],
    ARRAY['ledger_grant_link(bigint, bytea, text, text, text, text, bigint, bigint, bigint, text, bigint)',
          'grant_append(text, text, text, bigint, bigint, bigint, text)',
          'grant_release_draws(text, bigint, text, text)']);
