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

-- The pure helpers below (`_u64`, `_be8`, `_token_text`, `_is_resource`) have no `SET
-- search_path` of their own, so that PostgreSQL inlines them into their callers (a function
-- with a SET clause is never inlined, and each call of one saves and restores the setting: tens
-- of µs per admit). Every caller fixes search_path (pg_catalog first) and the helpers name only
-- pg_catalog's functions and operators, which are resolved under the caller's path; no writer
-- may call them directly (grants.sql), and they are SECURITY INVOKER.
-- Dropped in favour of comparing in `_verify` under a key read once (older installs had it).
DROP FUNCTION IF EXISTS @schema@._equal(bytea, bytea);

-- A canonical unsigned decimal that fits in 64 bits (no sign, no leading zero), else NULL.
CREATE OR REPLACE FUNCTION @schema@._u64(s text) RETURNS numeric
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT CASE WHEN s ~ '^(0|[1-9][0-9]{0,19})$' AND s::numeric <= 18446744073709551615
        THEN s::numeric END
$$;

-- The 8 big-endian bytes of a u64 (int8send writes two's complement, which for values past
-- 2^63 are the same bytes as the unsigned value's).
CREATE OR REPLACE FUNCTION @schema@._be8(n numeric) RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT int8send(CASE WHEN n >= 9223372036854775808 THEN (n - 18446744073709551616)::int8
        ELSE n::int8 END)
$$;

-- A 16-byte mark as `era:revision`.
CREATE OR REPLACE FUNCTION @schema@._token_text(b bytea) RETURNS text
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT format('%s:%s',
        CASE WHEN e < 0 THEN e + 18446744073709551616 ELSE e END,
        CASE WHEN r < 0 THEN r + 18446744073709551616 ELSE r END)
    FROM (SELECT ('x' || encode(substring(b FROM 1 FOR 8), 'hex'))::bit(64)::int8::numeric AS e,
                 ('x' || encode(substring(b FROM 9 FOR 8), 'hex'))::bit(64)::int8::numeric AS r) AS t
$$;

-- Exactly `n` bytes in canonical unpadded base64url (what the Rust decoder accepts: the right
-- length, the URL-safe alphabet, no padding, zero trailing bits), else NULL.
CREATE OR REPLACE FUNCTION @schema@._b64url(s text, n int) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    decoded bytea;
BEGIN
    IF length(s) <> (4 * n + 2) / 3 OR s !~ '^[A-Za-z0-9_-]+$' THEN
        RETURN NULL;
    END IF;
    decoded := decode(translate(s, '-_', '+/') || repeat('=', (4 - length(s) % 4) % 4), 'base64');
    IF length(decoded) <> n
        OR rtrim(translate(replace(encode(decoded, 'base64'), E'\n', ''), '+/', '-_'), '=') <> s THEN
        RETURN NULL;
    END IF;
    RETURN decoded;
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
    compare_key bytea;
BEGIN
    IF NOT @schema@._is_resource(resource) THEN
        code := '22F01';
        reason := format('%s is not a fencing resource name', coalesce(quote_literal(resource), 'NULL'));
        RETURN;
    END IF;
    IF wire IS NOT NULL AND octet_length(wire) <= 256 THEN
        parts := string_to_array(wire, '.');
    END IF;
    IF parts IS NULL OR cardinality(parts) <> 6 OR parts[1] <> 'v1'
        OR parts[2] !~ '^[A-Za-z0-9_-]{1,32}$' THEN
        code := '28F01';
        reason := 'malformed fencing token';
        RETURN;
    END IF;
    era := @schema@._u64(parts[3]);
    revision := @schema@._u64(parts[4]);
    tag := @schema@._b64url(parts[5], 16);
    mac := @schema@._b64url(parts[6], 32);
    IF era IS NULL OR revision IS NULL OR tag IS NULL OR mac IS NULL THEN
        code := '28F01';
        reason := 'malformed fencing token';
        RETURN;
    END IF;
    SELECT k.secret INTO secret FROM @schema@.keys AS k WHERE k.kid = parts[2];
    -- MACs are compared as HMACs of both under a random key of this install: pgcrypto has no
    -- constant-time compare, and `=` on bytea stops at the first differing byte; compared this
    -- way, the timing is independent of how much of a forged value is right.
    SELECT s.compare_key INTO compare_key FROM @schema@.settings AS s WHERE s.id = 1;
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
    expected := @crypto@.hmac(
        convert_to('lease-proxy/fencing/token/v1', 'UTF8') || decode('00', 'hex')
            || convert_to(parts[2], 'UTF8') || decode('00', 'hex')
            || @schema@._be8(era) || @schema@._be8(revision) || tag,
        secret, 'sha256'::text);
    IF @crypto@.hmac(expected, compare_key, 'sha256'::text)
        IS DISTINCT FROM @crypto@.hmac(mac, compare_key, 'sha256'::text) THEN
        code := '28F03';
        reason := 'fencing token signature is invalid';
        RETURN;
    END IF;
    expected := substring(@crypto@.hmac(
        convert_to('lease-proxy/fencing/resource/v1', 'UTF8') || decode('00', 'hex')
            || convert_to(resource, 'UTF8'),
        secret, 'sha256'::text) FROM 1 FOR 16);
    IF @crypto@.hmac(expected, compare_key, 'sha256'::text)
        IS DISTINCT FROM @crypto@.hmac(tag, compare_key, 'sha256'::text) THEN
        code := '28F04';
        reason := format('fencing token was issued for another resource than %s', quote_literal(resource));
        RETURN;
    END IF;
    token := @schema@._be8(era) || @schema@._be8(revision);
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
-- token as `era:revision`.
CREATE OR REPLACE FUNCTION @schema@.admit(resource text, token text) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp AS $$
DECLARE
    v record;
BEGIN
    v := @schema@._verify(resource, token);
    IF v.code IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v.code, MESSAGE = v.reason;
    END IF;
    PERFORM @schema@._order(resource, v.token);
    RETURN @schema@._token_text(v.token);
END
$$;

-- Trigger mode: admits the transaction for `resource` with one of the tokens it presented in
-- the transaction-local setting `fencing.token` (whitespace- or comma-separated, any order). A
-- setting is only a claim: each token is verified here. Tokens issued for other resources are
-- passed over; a malformed, unknown-key or forged one refuses the write outright.
CREATE OR REPLACE FUNCTION @schema@.admit_presented(resource text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp AS $$
DECLARE
    claim text := btrim(coalesce(current_setting('fencing.token', true), ''));
    wire text;
    v record;
BEGIN
    IF NOT @schema@._is_resource(resource) THEN
        RAISE EXCEPTION USING ERRCODE = '22F01',
            MESSAGE = format('%s is not a fencing resource name', coalesce(quote_literal(resource), 'NULL'));
    END IF;
    IF claim = '' THEN
        RAISE EXCEPTION USING ERRCODE = '28F05',
            MESSAGE = format('no fencing token presented for resource %s', quote_literal(resource)),
            HINT = 'SET LOCAL fencing.token = ''<token>'' in the writing transaction.';
    END IF;
    FOREACH wire IN ARRAY regexp_split_to_array(claim, '[[:space:],]+') LOOP
        v := @schema@._verify(resource, wire);
        CONTINUE WHEN v.code = '28F04';
        IF v.code IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = v.code, MESSAGE = v.reason;
        END IF;
        PERFORM @schema@._order(resource, v.token);
        RETURN;
    END LOOP;
    RAISE EXCEPTION USING ERRCODE = '28F04',
        MESSAGE = format('no presented fencing token was issued for resource %s', quote_literal(resource));
END
$$;

-- The row trigger of a protected table (AFTER, so it checks the row as written, after every
-- BEFORE trigger). TG_ARGV[0] is the resource expression over the row's columns; it is
-- evaluated with this function's search_path, as the writing role.
CREATE OR REPLACE FUNCTION @schema@.row_guard() RETURNS trigger
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, @schema@, pg_temp AS $$
DECLARE
    query text := format('SELECT (%s)::text FROM (SELECT ($1).*) AS fenced_row', TG_ARGV[0]);
    new_resource text;
    old_resource text;
BEGIN
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        EXECUTE query INTO new_resource USING NEW;
        PERFORM @schema@.admit_presented(new_resource);
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        EXECUTE query INTO old_resource USING OLD;
        IF TG_OP = 'DELETE' OR old_resource IS DISTINCT FROM new_resource THEN
            PERFORM @schema@.admit_presented(old_resource);
        END IF;
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION @schema@.refuse_truncate() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = '0AF01',
        MESSAGE = format('TRUNCATE of %s is refused: it is fenced row by row', TG_RELID::regclass),
        HINT = 'DELETE the rows in a fenced transaction instead.';
END
$$;

-- Protects a table: every row INSERT, UPDATE (the old and the new row's resource) and DELETE
-- must be admitted (admit_presented) for the resource `resource_expression` gives for that row;
-- TRUNCATE is refused. The triggers fire ALWAYS, whatever session_replication_role says. Run by
-- the table's owner (it alone may create and enable the triggers); protecting again replaces
-- the expression.
CREATE OR REPLACE FUNCTION @schema@.protect(tbl regclass, resource_expression text) RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, @schema@, pg_temp
    SET client_min_messages = warning AS $$
BEGIN
    -- Checks the expression against the row type now, not at the first write.
    EXECUTE format('SELECT (%s)::text FROM (SELECT (NULL::%s).*) AS fenced_row', resource_expression, tbl);
    EXECUTE format('DROP TRIGGER IF EXISTS fence_guard ON %s', tbl);
    EXECUTE format('DROP TRIGGER IF EXISTS fence_guard_truncate ON %s', tbl);
    EXECUTE format('CREATE TRIGGER fence_guard AFTER INSERT OR UPDATE OR DELETE ON %s '
        'FOR EACH ROW EXECUTE FUNCTION @schema@.row_guard(%L)', tbl, resource_expression);
    EXECUTE format('CREATE TRIGGER fence_guard_truncate BEFORE TRUNCATE ON %s '
        'FOR EACH STATEMENT EXECUTE FUNCTION @schema@.refuse_truncate()', tbl);
    EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER fence_guard', tbl);
    EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER fence_guard_truncate', tbl);
END
$$;

-- Removes what protect installed (run by the table's owner).
CREATE OR REPLACE FUNCTION @schema@.unprotect(tbl regclass) RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, @schema@, pg_temp
    SET client_min_messages = warning AS $$
BEGIN
    EXECUTE format('DROP TRIGGER IF EXISTS fence_guard ON %s', tbl);
    EXECUTE format('DROP TRIGGER IF EXISTS fence_guard_truncate ON %s', tbl);
END
$$;

-- The mark of `resource` as `era:revision`, NULL if it has none.
CREATE OR REPLACE FUNCTION @schema@.mark(resource text) RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp AS $$
    SELECT @schema@._token_text(m.mark) FROM @schema@.fence_marks AS m WHERE m.resource = mark.resource
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
