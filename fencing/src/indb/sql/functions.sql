-- The package's functions, (re)created by every install as the package's owner role.
-- `@schema@` is the package schema, `@crypto@` the schema holding pgcrypto.
--
-- Every function has a fixed `search_path` (pg_catalog first, then the package schema, pg_temp
-- last so that a temporary object never shadows anything) and names every table and pgcrypto
-- function by its schema, so nothing a caller plants — in public, in its own schema, in pg_temp,
-- or through its session's search_path — is ever resolved in their place.
--
-- SQLSTATEs (docs/POSTGRES.md):
--   23F01 stale token (below the mark)            -- never retry: the lease is lost
--   28F01 malformed token    28F02 unknown key id  28F03 bad signature (forged or altered)
--   28F04 token issued for another resource       28F05 no token presented (trigger mode)
--   22F01 not a fencing resource name
--   40F01 lower-token writes still in flight through a gateway  -- retry the transaction
--   55F01 a raise inside a REPEATABLE READ or SERIALIZABLE transaction -- raise first
--   0AF01 TRUNCATE of a protected table
--   55F02 a table under a protected one is not protected (protect.sql)
--   0AF02 what is under a table to protect cannot be fenced (protect.sql)

-- The pure helpers below (`_be8`, `_token_text`, `_is_resource`) have no `SET search_path` of
-- their own: each call of a function with a SET clause saves, sets and restores the setting
-- (and recomputes the namespace path), and such a function is never inlined. Every caller
-- fixes search_path (pg_catalog first) and the helpers name only pg_catalog's functions and
-- operators, which are resolved under the caller's path; no writer may call them directly
-- (grants.sql), and they are SECURITY INVOKER. Those PostgreSQL could not inline (a STRICT
-- function over a non-strict expression, a FROM clause) are PL/pgSQL: an SQL function that is
-- not inlined is parsed and planned again in every transaction that calls it (pgfencebench:
-- ~120 µs of a 290 µs verify).
-- Dropped in favour of comparing in `_verify` under a key read once, and of parsing the token
-- in `_verify` itself (older installs had them).
DROP FUNCTION IF EXISTS @schema@._equal(bytea, bytea);
DROP FUNCTION IF EXISTS @schema@._u64(text);
DROP FUNCTION IF EXISTS @schema@._b64url(text, int);

-- The 8 big-endian bytes of a u64 (int8send writes two's complement, which for values past
-- 2^63 are the same bytes as the unsigned value's).
CREATE OR REPLACE FUNCTION @schema@._be8(n numeric) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
BEGIN
    RETURN int8send(CASE WHEN n >= 9223372036854775808 THEN (n - 18446744073709551616)::int8
        ELSE n::int8 END);
END
$$;

-- A 16-byte mark as `era:revision`.
CREATE OR REPLACE FUNCTION @schema@._token_text(b bytea) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
    e numeric := ('x' || encode(substring(b FROM 1 FOR 8), 'hex'))::bit(64)::int8::numeric;
    r numeric := ('x' || encode(substring(b FROM 9 FOR 8), 'hex'))::bit(64)::int8::numeric;
BEGIN
    RETURN format('%s:%s',
        CASE WHEN e < 0 THEN e + 18446744073709551616 ELSE e END,
        CASE WHEN r < 0 THEN r + 18446744073709551616 ELSE r END);
END
$$;

-- A name the enforcers fence (fencing/src/layer/classify.rs `is_resource`, fencing/src/domain.rs):
-- a `/v1` resource, 1–200 of [A-Za-z0-9._:-] starting with a letter or digit, without `..`; or
-- a `/v3` lock domain, `lock/` and 2–192 lowercase hex digits, an even number.
CREATE OR REPLACE FUNCTION @schema@._is_resource(r text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT r IS NOT NULL AND (
        (r ~ '^lock/[0-9a-f]+$' AND length(r) BETWEEN 7 AND 197 AND length(r) % 2 = 1)
        OR (r ~ '^[A-Za-z0-9][A-Za-z0-9._:-]*$' AND octet_length(r) <= 200
            AND strpos(r, '..') = 0))
$$;

-- A resource name quoted for a message: at most its first 200 characters (a valid name has no
-- more), so that a hostile one does not make the error (and the server log) as long as itself.
CREATE OR REPLACE FUNCTION @schema@._quoted_name(r text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN r IS NULL THEN 'NULL'
        WHEN length(r) <= 200 THEN quote_literal(r)
        ELSE quote_literal(left(r, 200)) || format('… (%s characters)', length(r)) END
$$;

-- Verifies a wire token for `resource` exactly as fencing::keys::Keyring::verify does
-- (fencing/src/keys/mod.rs), in the same order: syntax, key id, MAC, resource tag. Never
-- raises: `code` is NULL and `token` the 16-byte big-endian `era ‖ revision` when the token is
-- valid, else `code` is the SQLSTATE of the refusal and `reason` says why.
CREATE OR REPLACE FUNCTION @schema@._verify(
    resource text, wire text, OUT token bytea, OUT code text, OUT reason text)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, @schema@, pg_temp AS $$
DECLARE
    parts text[];
    era numeric;
    revision numeric;
    tag bytea;
    mac bytea;
    secret bytea;
    expected bytea;
    expected_tag bytea;
    compare_key bytea;
BEGIN
    IF NOT @schema@._is_resource(resource) THEN
        code := '22F01';
        reason := format('%s is not a fencing resource name', @schema@._quoted_name(resource));
        RETURN;
    END IF;
    -- `v1.{kid}.{era}.{revision}.{tag}.{mac}`: the key id 1–32 of [A-Za-z0-9_-]; era and
    -- revision canonical decimals (no sign, no leading zero) below 2^64; tag (16 bytes) and mac
    -- (32) in canonical unpadded base64url: the exact length, the URL-safe alphabet, and a last
    -- character whose unused low bits are zero (4 of them for 16 bytes in 22 characters, 2 for
    -- 32 in 43), as the Rust decoder requires. (No counted repetition in a pattern: PostgreSQL's
    -- regex engine takes hundreds of µs over `{42}`.)
    IF wire IS NOT NULL AND octet_length(wire) <= 256 THEN
        parts := string_to_array(wire, '.');
    END IF;
    IF parts IS NULL OR cardinality(parts) <> 6 OR parts[1] <> 'v1'
        OR length(parts[2]) > 32 OR parts[2] !~ '^[A-Za-z0-9_-]+$'
        OR length(parts[3]) > 20 OR NOT (parts[3] = '0' OR parts[3] ~ '^[1-9][0-9]*$')
        OR length(parts[4]) > 20 OR NOT (parts[4] = '0' OR parts[4] ~ '^[1-9][0-9]*$')
        OR length(parts[5]) <> 22 OR parts[5] !~ '^[A-Za-z0-9_-]+$' OR strpos('AQgw', right(parts[5], 1)) = 0
        OR length(parts[6]) <> 43 OR parts[6] !~ '^[A-Za-z0-9_-]+$'
        OR strpos('AEIMQUYcgkosw048', right(parts[6], 1)) = 0 THEN
        code := '28F01';
        reason := 'malformed fencing token';
        RETURN;
    END IF;
    -- Only digits by now: the casts cannot fail.
    era := parts[3]::numeric;
    revision := parts[4]::numeric;
    IF era > 18446744073709551615 OR revision > 18446744073709551615 THEN
        code := '28F01';
        reason := 'malformed fencing token';
        RETURN;
    END IF;
    tag := decode(translate(parts[5], '-_', '+/') || '==', 'base64');
    mac := decode(translate(parts[6], '-_', '+/') || '=', 'base64');
    -- MACs are compared as HMACs of both under a random key of this install: pgcrypto has no
    -- constant-time compare, and `=` on bytea stops at the first differing byte; compared this
    -- way, the timing is independent of how much of a forged value is right.
    SELECT s.compare_key, (SELECT k.secret FROM @schema@.keys AS k WHERE k.kid = parts[2])
        INTO compare_key, secret
        FROM @schema@.settings AS s WHERE s.id = 1;
    IF compare_key IS NULL THEN
        -- A comparison under a NULL key would be NULL, and pass: nothing verifies without it.
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = 'the fencing package has no compare key (its settings row is missing)';
    END IF;
    IF secret IS NULL THEN
        code := '28F02';
        reason := format('fencing token signed with an unknown key %s', quote_literal(parts[2]));
        RETURN;
    END IF;
    token := @schema@._be8(era) || @schema@._be8(revision);
    expected := @crypto@.hmac(
        convert_to('lease-proxy/fencing/token/v1', 'UTF8') || decode('00', 'hex')
            || convert_to(parts[2], 'UTF8') || decode('00', 'hex') || token || tag,
        secret, 'sha256'::text);
    expected_tag := substring(@crypto@.hmac(
        convert_to('lease-proxy/fencing/resource/v1', 'UTF8') || decode('00', 'hex')
            || convert_to(resource, 'UTF8'),
        secret, 'sha256'::text) FROM 1 FOR 16);
    -- Both at once (32 + 16 bytes each side); only a refusal tells which differs, in the order
    -- Keyring::verify checks them: the signature, then the resource.
    IF @crypto@.hmac(expected || expected_tag, compare_key, 'sha256'::text)
        = @crypto@.hmac(mac || tag, compare_key, 'sha256'::text) THEN
        RETURN;
    END IF;
    token := NULL;
    IF @crypto@.hmac(expected, compare_key, 'sha256'::text)
        IS DISTINCT FROM @crypto@.hmac(mac, compare_key, 'sha256'::text) THEN
        code := '28F03';
        reason := 'fencing token signature is invalid';
    ELSE
        code := '28F04';
        reason := format('fencing token was issued for another resource than %s', quote_literal(resource));
    END IF;
END
$$;

-- Remembered verdicts (the `verdicts` table, v2.sql and v3.sql). A token that verified once for
-- a resource is not verified again: its holder's next transactions look it up by the wire
-- text's exact bytes and the resource, which only a token that verified for that very resource
-- can match (a row is written only below, after `_verify` accepted it, by the owner). A token
-- never verified, forged, altered or presented for another resource finds no row and costs the
-- full verification, as before. `pg sync-keys` deletes every key row, and with them every
-- remembered verdict (ON DELETE CASCADE). These two helpers have no `SET search_path` (a SET
-- clause costs a save and restore on every call, and this is the path every transaction
-- takes): they are called only by `admit` and `admit_presented`, whose search_path is fixed,
-- name every table by its schema, and no writer may call them (grants.sql).

-- The fast path of a holder writing again: if `wire` is remembered as verified for `resource`,
-- its token is the mark, and no lower-token gateway write is live, takes the mark row
-- `FOR SHARE` (as `_order` does at the mark) and returns the token as `era:revision`; else
-- NULL, having locked nothing (the caller then takes the general path). A raise open on the row
-- makes the lock wait, and then the moved mark no longer matches: NULL.
CREATE OR REPLACE FUNCTION @schema@._recall(resource text, wire text) RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    shown text;
BEGIN
    IF current_setting('max_prepared_transactions') <> '0' THEN
        PERFORM @schema@._unpreparable();
    END IF;
    SELECT v.shown INTO shown
        FROM @schema@.verdicts AS v
        JOIN @schema@.fence_marks AS m ON m.resource = v.resource AND m.mark = v.token
        WHERE v.resource = _recall.resource AND v.wire = _recall.wire
          AND NOT EXISTS (SELECT FROM @schema@.fence_inflight AS f
              WHERE f.resource = v.resource AND f.token < v.token
                AND f.expires_at > clock_timestamp())
        FOR SHARE OF m;
    RETURN shown;
END
$$;

-- `_verify`, remembering what verifies: the same verdict for every input. A remembered token
-- is returned without verifying; otherwise the key row the token names is locked `FOR SHARE`
-- first — so the secret `_verify` then reads is the one in force until this transaction ends
-- (a `pg sync-keys` deleting it waits, and its cascade then deletes the verdict; one that
-- committed before makes the lock find nothing in READ COMMITTED, and fail with 40001 in
-- REPEATABLE READ or SERIALIZABLE) — and a valid token is remembered under that key. A
-- remembered token takes no key row: a transaction whose snapshot predates a sync still finds
-- its verdict (docs/POSTGRES.md, "Remembered verdicts").
CREATE OR REPLACE FUNCTION @schema@._verified(
    resource text, wire text, OUT token bytea, OUT code text, OUT reason text)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    wire_kid text := split_part(wire, '.', 2);
    locked boolean;
BEGIN
    SELECT v.token INTO token FROM @schema@.verdicts AS v
        WHERE v.resource = _verified.resource AND v.wire = _verified.wire;
    IF FOUND THEN
        RETURN;
    END IF;
    PERFORM FROM @schema@.keys AS k WHERE k.kid = wire_kid FOR SHARE;
    locked := FOUND;
    SELECT v.token, v.code, v.reason INTO token, code, reason
        FROM @schema@._verify(resource, wire) AS v;
    IF code IS NULL AND locked THEN
        INSERT INTO @schema@.verdicts AS v (resource, wire, kid, token, shown)
            VALUES (_verified.resource, _verified.wire, wire_kid, _verified.token,
                @schema@._token_text(_verified.token))
            ON CONFLICT ON CONSTRAINT verdicts_pkey DO NOTHING;
    END IF;
END
$$;

-- Makes the caller's transaction one PostgreSQL refuses to PREPARE (two-phase commit): it
-- locks a temporary table of the session's, and a transaction that touched the session's
-- temporary objects cannot be prepared (0A000) — nothing later in the transaction can undo
-- that. A prepared transaction would keep the mark row's lock, and its writes pending, past
-- every session and idle timeout, until someone commits it: a new holder's raise would wait
-- for it, and every grant fail, indefinitely. Called only where transactions can be prepared
-- (max_prepared_transactions > 0), as the package's owner (admit and admit_presented are
-- SECURITY DEFINER), who makes the table once per session (TEMPORARY on the database). LOCK,
-- not SELECT: a relation of that name a writer made in its session runs nothing as the owner
-- (no view, no row-security policy is expanded) — it is refused.
CREATE OR REPLACE FUNCTION @schema@._unpreparable() RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    found regclass := to_regclass('pg_temp.fencing_unpreparable');
BEGIN
    IF found IS NULL THEN
        CREATE TEMPORARY TABLE fencing_unpreparable ();
    ELSIF NOT EXISTS (SELECT FROM pg_class AS c WHERE c.oid = found AND c.relkind = 'r'
            AND c.relowner = (SELECT r.oid FROM pg_roles AS r WHERE r.rolname = current_user)) THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = 'pg_temp.fencing_unpreparable is not the fencing package''s table',
            HINT = 'Drop it (DISCARD TEMP) and retry.';
    END IF;
    LOCK TABLE pg_temp.fencing_unpreparable IN ACCESS SHARE MODE;
END
$$;

-- Orders the caller's transaction against every other writer of `resource`, for the rest of
-- the transaction, or raises:
-- - below the mark: 23F01 (no lock needed: a mark never goes down);
-- - at the mark: the mark row `FOR SHARE` — transactions at the mark run side by side, and a
--   raise (`FOR UPDATE`) waits until each of them has committed or rolled back;
-- - above the mark (or no mark yet): `FOR UPDATE` and the raise, which waits for the open
--   transactions at the old mark (Temporal's range_id pattern) and, once committed, refuses
--   lower tokens. Only in READ COMMITTED (55F01 otherwise: see below);
-- then, in every case, waits until no lower-token write registered by a fence-gateway
-- (fence_inflight) is live, so that none lands after this transaction: polling on fresh
-- snapshots (READ COMMITTED), up to settings.max_wait (then 40F01). Registrations cannot be added
-- meanwhile: below a raised mark they block on the row lock, below a committed one they are
-- refused. A REPEATABLE READ or SERIALIZABLE snapshot cannot see a registration committed after
-- it was taken, nor one deleted since, so there a raise is refused (55F01: raise the mark first
-- in a READ COMMITTED transaction, e.g. an autocommit `SELECT admit(…)`), and a live lower
-- registration refuses the transaction (40F01) instead of waiting. At the mark the snapshot is
-- enough: every lower registration committed before the raise did, which the snapshot sees.
CREATE OR REPLACE FUNCTION @schema@._order(resource text, token bytea) RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, @schema@, pg_temp AS $$
DECLARE
    mark bytea;
    created boolean := false;
    read_committed boolean := current_setting('transaction_isolation') = 'read committed';
    live bigint;
    first_expiry timestamptz;
    give_up timestamptz;
    pause float8 := 0.001;
BEGIN
    IF current_setting('max_prepared_transactions') <> '0' THEN
        PERFORM @schema@._unpreparable();
    END IF;
    -- A holder writing again (at the mark, no gateway write of a lower token live): one
    -- statement. If a raise is open on the row, the lock waits for it and then finds the mark
    -- moved (no row): the general path below then refuses.
    SELECT (SELECT count(*) FROM @schema@.fence_inflight AS f
            WHERE f.resource = _order.resource AND f.token < _order.token
              AND f.expires_at > clock_timestamp())
        INTO live
        FROM @schema@.fence_marks AS m
        WHERE m.resource = _order.resource AND m.mark = _order.token
        FOR SHARE OF m;
    IF FOUND AND live = 0 THEN
        RETURN;
    END IF;
    SELECT m.mark INTO mark FROM @schema@.fence_marks AS m WHERE m.resource = _order.resource;
    IF mark IS NOT NULL AND token < mark THEN
        RAISE EXCEPTION USING ERRCODE = '23F01',
            MESSAGE = format('fencing token %s for resource %s is below its mark %s',
                @schema@._token_text(token), quote_literal(resource), @schema@._token_text(mark)),
            HINT = 'The holder of this token has lost its lease: do not retry with it.';
    END IF;
    IF mark IS NULL THEN
        -- No registration exists without a mark row, so creating it needs no wait.
        INSERT INTO @schema@.fence_marks AS m (resource, mark) VALUES (_order.resource, token)
            ON CONFLICT ON CONSTRAINT fence_marks_pkey DO NOTHING
            RETURNING true INTO created;
        created := coalesce(created, false);
    END IF;
    IF NOT created THEN
        IF mark IS NULL OR token > mark THEN
            SELECT m.mark INTO mark FROM @schema@.fence_marks AS m
                WHERE m.resource = _order.resource FOR UPDATE;
        ELSE
            SELECT m.mark INTO mark FROM @schema@.fence_marks AS m
                WHERE m.resource = _order.resource FOR SHARE;
        END IF;
        IF token < mark THEN
            RAISE EXCEPTION USING ERRCODE = '23F01',
                MESSAGE = format('fencing token %s for resource %s is below its mark %s',
                    @schema@._token_text(token), quote_literal(resource), @schema@._token_text(mark)),
                HINT = 'The holder of this token has lost its lease: do not retry with it.';
        END IF;
        IF token > mark THEN
            IF NOT read_committed THEN
                RAISE EXCEPTION USING ERRCODE = '55F01',
                    MESSAGE = format('fencing token %s would raise the mark %s of resource %s inside a %s transaction',
                        @schema@._token_text(token), @schema@._token_text(mark), quote_literal(resource),
                        upper(current_setting('transaction_isolation'))),
                    HINT = 'Raise the mark first in a READ COMMITTED transaction (e.g. an autocommit SELECT admit(…)), then retry.';
            END IF;
            -- Guarded as well: whatever the lock, a mark never goes down.
            UPDATE @schema@.fence_marks AS m SET mark = token
                WHERE m.resource = _order.resource AND m.mark < token;
            IF NOT FOUND THEN
                RAISE EXCEPTION USING ERRCODE = '23F01',
                    MESSAGE = format('fencing token %s for resource %s is below its mark',
                        @schema@._token_text(token), quote_literal(resource));
            END IF;
            -- Tokens below the mark are refused whatever was remembered of them.
            DELETE FROM @schema@.verdicts AS v
                WHERE v.resource = _order.resource AND v.token < _order.token;
        END IF;
    END IF;
    LOOP
        SELECT count(*), min(f.expires_at) INTO live, first_expiry
            FROM @schema@.fence_inflight AS f
            WHERE f.resource = _order.resource AND f.token < _order.token
              AND f.expires_at > clock_timestamp();
        EXIT WHEN live = 0;
        IF give_up IS NULL THEN
            SELECT clock_timestamp() + s.max_wait INTO give_up FROM @schema@.settings AS s WHERE s.id = 1;
        END IF;
        IF NOT read_committed OR clock_timestamp() >= give_up THEN
            RAISE EXCEPTION USING ERRCODE = '40F01',
                MESSAGE = format('%s write(s) with a lower fencing token than %s are still in flight through a fence-gateway on resource %s',
                    live, @schema@._token_text(token), quote_literal(resource)),
                HINT = 'Retry the transaction.';
        END IF;
        PERFORM pg_sleep(least(pause, greatest(extract(epoch FROM first_expiry - clock_timestamp()), 0) + 0.001));
        pause := least(pause * 2, 0.025);
    END LOOP;
END
$$;

-- Admits the caller's transaction as a writer of `resource` with the signed `token`, or raises
-- (SQLSTATEs above). Holds the lock that orders it until the transaction ends. Returns the
-- token as `era:revision`. Adds the token to the transaction's claim (`fencing.token`, unless it
-- is there already), so that the triggers of protected tables find it: they verify it again,
-- as they verify any claim, so this lets through nothing a `SET LOCAL` of the same token would
-- not.
CREATE OR REPLACE FUNCTION @schema@.admit(resource text, token text) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp AS $$
DECLARE
    v record;
    claim text := coalesce(current_setting('fencing.token', true), '');
    -- Every name and token compared under the database's default collation, never the
    -- caller's: a nondeterministic collation on an argument (case- or punctuation-insensitive)
    -- would otherwise make one resource's verdict and mark match another's.
    shown text := @schema@._recall(resource COLLATE "default", token COLLATE "default");
BEGIN
    IF shown IS NULL THEN
        v := @schema@._verified(resource COLLATE "default", token COLLATE "default");
        IF v.code IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = v.code, MESSAGE = v.reason;
        END IF;
        PERFORM @schema@._order(resource COLLATE "default", v.token);
        shown := @schema@._token_text(v.token);
    END IF;
    IF strpos(claim COLLATE "default", token COLLATE "default") = 0 THEN
        PERFORM set_config('fencing.token', CASE WHEN claim = '' THEN token ELSE claim || ' ' || token END, true);
    END IF;
    RETURN shown;
END
$$;

-- Trigger mode: admits the transaction for `resource` with one of the tokens it presented in
-- the transaction-local setting `fencing.token` (separated by any run of whitespace and commas,
-- in any order; separators before, after or in a row separate nothing). A setting is only a
-- claim: each token is verified here. Tokens issued for other resources are passed over; a
-- malformed, unknown-key or forged one refuses the write outright.
CREATE OR REPLACE FUNCTION @schema@.admit_presented(resource text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp AS $$
DECLARE
    claim text := current_setting('fencing.token', true);
    tokens text[];
    wire text;
    v record;
BEGIN
    -- A claim of one token remembered for this resource: a remembered wire verified, so it
    -- has no separator, and splitting the claim would give that token alone.
    -- Compared under the database's default collation, never the caller's (see admit).
    IF octet_length(claim) <= 256
        AND @schema@._recall(resource COLLATE "default", claim COLLATE "default") IS NOT NULL THEN
        RETURN;
    END IF;
    tokens := array_remove(regexp_split_to_array(coalesce(claim, '') COLLATE "default", '[[:space:],]+'), '');
    IF NOT @schema@._is_resource(resource COLLATE "default") THEN
        RAISE EXCEPTION USING ERRCODE = '22F01',
            MESSAGE = format('%s is not a fencing resource name', @schema@._quoted_name(resource));
    END IF;
    IF cardinality(tokens) = 0 THEN
        RAISE EXCEPTION USING ERRCODE = '28F05',
            MESSAGE = format('no fencing token presented for resource %s', quote_literal(resource)),
            HINT = 'SET LOCAL fencing.token = ''<token>'' in the writing transaction.';
    END IF;
    FOREACH wire IN ARRAY tokens LOOP
        v := @schema@._verified(resource COLLATE "default", wire COLLATE "default");
        CONTINUE WHEN v.code = '28F04';
        IF v.code IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = v.code, MESSAGE = v.reason;
        END IF;
        PERFORM @schema@._order(resource COLLATE "default", v.token);
        RETURN;
    END LOOP;
    RAISE EXCEPTION USING ERRCODE = '28F04',
        MESSAGE = format('no presented fencing token was issued for resource %s', quote_literal(resource));
END
$$;

-- The mark of `resource` as `era:revision`, NULL if it has none.
CREATE OR REPLACE FUNCTION @schema@.mark(resource text) RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp AS $$
    SELECT @schema@._token_text(m.mark) FROM @schema@.fence_marks AS m
        WHERE m.resource = (mark.resource COLLATE "default")
$$;

-- Replaces the verification keys whole (pg sync-keys): the first key is the file's signing key.
CREATE OR REPLACE FUNCTION @schema@.replace_keys(kids text[], secrets bytea[]) RETURNS int
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, @schema@, pg_temp AS $$
BEGIN
    IF kids IS NULL OR secrets IS NULL OR cardinality(kids) = 0
        OR cardinality(kids) <> cardinality(secrets) THEN
        RAISE EXCEPTION 'replace_keys: one secret per key id, at least one key';
    END IF;
    DELETE FROM @schema@.keys;
    INSERT INTO @schema@.keys (kid, secret, position)
        SELECT k.kid, k.secret, k.position::int
        FROM unnest(kids, secrets) WITH ORDINALITY AS k (kid, secret, position);
    RETURN cardinality(kids);
END
$$;

-- The key ids that verify, signing key first (never a secret).
CREATE OR REPLACE FUNCTION @schema@.key_ids() RETURNS SETOF text
LANGUAGE sql STABLE SET search_path = pg_catalog, @schema@, pg_temp AS $$
    SELECT k.kid FROM @schema@.keys AS k ORDER BY k.position
$$;
