-- The in-database package from psql, one session after another in one process
-- (fencing/tests/pg_package.rs runs it and compares the output with cases.out).
-- Variables: roles :app (a writer), :nobody (no package grants), :gw (a gateway role),
-- :owner; tokens minted by fencing::Keyring (key k1 unless named otherwise).
\set VERBOSITY terse
\set SHOW_CONTEXT never
\pset pager off

-- 1. A writer admits, the mark rises, a lower token is refused.
\c - :app
SELECT fencing.admit('aisle-1', :'a1_5');
SELECT fencing.mark('aisle-1');
SELECT fencing.admit('aisle-1', :'a1_5');
SELECT fencing.admit('aisle-1', :'a1_7');
SELECT fencing.admit('aisle-1', :'a1_5');
\echo :SQLSTATE
SELECT fencing.mark('aisle-1');
-- The era orders before the revision; the extremes of u64 round-trip.
SELECT fencing.admit('aisle-1', :'a1_era1');
SELECT fencing.admit('aisle-1', :'a1_max_revision');
\echo :SQLSTATE
SELECT fencing.admit('aisle-9', :'a9_max');
SELECT fencing.mark('aisle-9');

-- 2. Forged, misdirected, other-domain and malformed tokens.
SELECT fencing.admit('aisle-2', :'a2_forged_number');
\echo :SQLSTATE
SELECT fencing.admit('aisle-2', :'a2_other_ring');
\echo :SQLSTATE
SELECT fencing.admit('aisle-2', :'a1_7');
\echo :SQLSTATE
SELECT fencing.admit('aisle-1', :'lock_aisle_1');
\echo :SQLSTATE
SELECT fencing.admit('lock/6169736c652d31', :'a1_7');
\echo :SQLSTATE
SELECT fencing.admit('lock/6169736c652d31', :'lock_aisle_1');
SELECT fencing.admit('aisle-2', :'a2_unknown_kid');
\echo :SQLSTATE
SELECT fencing.admit('aisle-2', 'v1.k1.0.3');
\echo :SQLSTATE
SELECT fencing.admit('aisle-2', :'a2_leading_zero');
SELECT fencing.admit('aisle-2', :'a2_padded');
SELECT fencing.admit('aisle-2', :'a2_trailing_bits');
SELECT fencing.admit('aisle-2', :'a2_seven_parts');
SELECT fencing.admit('aisle-2', :'a2_v2');
SELECT fencing.admit('aisle-2', :'a2_too_big');
SELECT fencing.admit('aisle-2', repeat('v', 300));
SELECT fencing.admit('aisle-2', NULL);
SELECT fencing.admit('aisle/2', :'a1_7');
\echo :SQLSTATE
SELECT fencing.admit('lock/abc', :'a1_7');
SELECT fencing.admit('a..b', :'a1_7');
SELECT fencing.admit(NULL, :'a1_7');
SELECT fencing.mark('aisle-2');

-- 3. Keys: a removed key stops verifying, a malformed key file changes nothing, rotation.
\! "$FENCE_GATEWAY" pg sync-keys --database-url "$DB_URL" --key-file "$KEYS_K2"; echo "exit $?"
SELECT fencing.admit('aisle-3', :'a3_k1');
\echo :SQLSTATE
SELECT fencing.admit('aisle-3', :'a3_k2');
\! "$FENCE_GATEWAY" pg sync-keys --database-url "$DB_URL" --key-file "$KEYS_BAD"; echo "exit $?"
SELECT fencing.admit('aisle-3', :'a3_k2');
\! "$FENCE_GATEWAY" pg sync-keys --database-url "$DB_URL" --key-file "$KEYS_ROTATED"; echo "exit $?"
SELECT fencing.admit('aisle-3', :'a3_k2');
SELECT fencing.admit('aisle-3', :'a3_k3');
SELECT fencing.admit('aisle-3', :'a3_k1');
\echo :SQLSTATE
\! "$FENCE_GATEWAY" pg sync-keys --database-url "$DB_URL" --key-file "$KEYS_K1"; echo "exit $?"

-- 4. Trigger mode: a table its owner protects; rows fenced by their resource.
\c - :table_owner
CREATE TABLE inventory (aisle text PRIMARY KEY, count int NOT NULL);
GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON inventory TO :app, :nobody;
SELECT fencing.protect('inventory', '''aisle-'' || aisle');
SELECT fencing.protect('inventory', 'no_such_column');
\c - :app
INSERT INTO inventory VALUES ('4', 1);
\echo :SQLSTATE
BEGIN;
SET LOCAL fencing.token = :'a4_5';
INSERT INTO inventory VALUES ('4', 1);
UPDATE inventory SET count = 2 WHERE aisle = '4';
COMMIT;
BEGIN;
SET LOCAL fencing.token = :'a4_5';
INSERT INTO inventory VALUES ('5', 1);
\echo :SQLSTATE
ROLLBACK;
-- Several resources in one transaction: each row finds its own token.
BEGIN;
SELECT set_config('fencing.token', :'a4_5' || ' ' || :'a5_2', true) IS NOT NULL AS presented;
INSERT INTO inventory VALUES ('5', 1);
UPDATE inventory SET count = count + 10;
COMMIT;
-- Moving a row to another resource needs both tokens.
BEGIN;
SET LOCAL fencing.token = :'a4_5';
UPDATE inventory SET aisle = '6' WHERE aisle = '4';
\echo :SQLSTATE
ROLLBACK;
BEGIN;
SELECT set_config('fencing.token', :'a4_5' || ',' || :'a6_1', true) IS NOT NULL AS presented;
UPDATE inventory SET aisle = '6' WHERE aisle = '4';
COMMIT;
-- Tokens are tried in order: a forged one reached refuses the write; a stale one too.
BEGIN;
SELECT set_config('fencing.token', :'a2_forged_number' || ' ' || :'a6_1', true) IS NOT NULL AS presented;
DELETE FROM inventory WHERE aisle = '6';
\echo :SQLSTATE
ROLLBACK;
SELECT fencing.admit('aisle-5', :'a5_3');
BEGIN;
SET LOCAL fencing.token = :'a5_2';
DELETE FROM inventory WHERE aisle = '5';
\echo :SQLSTATE
ROLLBACK;
TRUNCATE inventory;
\echo :SQLSTATE
SELECT * FROM inventory ORDER BY aisle;

-- 5. What a writer cannot do: read keys, move marks, call the internals, skip the trigger.
SELECT * FROM fencing.keys;
SELECT count(*) FROM fencing.fence_marks;
UPDATE fencing.fence_marks SET mark = '\x00000000000000000000000000000001'::bytea;
DELETE FROM fencing.fence_marks;
INSERT INTO fencing.fence_marks VALUES ('aisle-7', '\xffffffffffffffffffffffffffffffff'::bytea);
SELECT fencing._order('aisle-1', '\x00000000000000000000000000000001'::bytea);
SELECT fencing._verify('aisle-1', :'a1_7');
SELECT fencing.replace_keys(ARRAY['k9'], ARRAY['\x00'::bytea]);
SELECT * FROM fencing.settings;
UPDATE fencing.settings SET max_wait = '0';
SET session_replication_role = replica;
ALTER TABLE inventory DISABLE TRIGGER fence_guard;
DROP TRIGGER fence_guard ON inventory;
SELECT fencing.unprotect('inventory');
-- Objects planted where a careless search_path would find them (CREATE on public, as before
-- PostgreSQL 15), a session search_path preferring them, a temporary table shadowing the marks.
CREATE FUNCTION public.admit_presented(text) RETURNS void LANGUAGE sql AS 'SELECT';
CREATE FUNCTION public.textcat_lie(text, text) RETURNS text LANGUAGE sql AS $$SELECT 'aisle-4'$$;
CREATE OPERATOR public.|| (LEFTARG = text, RIGHTARG = text, FUNCTION = public.textcat_lie);
CREATE TEMP TABLE fence_marks (resource text, mark bytea);
INSERT INTO fence_marks VALUES ('aisle-5', '\x00000000000000000000000000000000'::bytea);
SET search_path = pg_temp, public, fencing, pg_catalog;
SELECT 'x' || 'y' AS hijacked_here;
BEGIN;
SET LOCAL fencing.token = :'a4_5';
INSERT INTO inventory VALUES ('7', 1);
\echo :SQLSTATE
ROLLBACK;
RESET search_path;
\c - :nobody
SELECT fencing.admit('aisle-1', :'a1_9');
SELECT fencing.mark('aisle-1');
SELECT * FROM fencing.keys;
UPDATE fencing.fence_marks SET mark = mark;
BEGIN;
SET LOCAL fencing.token = :'a4_5';
INSERT INTO inventory VALUES ('8', 1);
ROLLBACK;
-- The table owner cannot skip it by session_replication_role either; TRUNCATE stays refused.
\c - :table_owner
SELECT tgname, tgenabled FROM pg_trigger WHERE tgrelid = 'inventory'::regclass ORDER BY 1;
SET session_replication_role = replica;
TRUNCATE inventory;
\echo :SQLSTATE

-- 6. A fence-gateway's lower-token write in flight (a registration in fence_inflight).
\c - :installer
UPDATE fencing.settings SET max_wait = '200 milliseconds';
\c - :gw
SELECT count(*) FROM fence_marks WHERE resource = 'aisle-1';
INSERT INTO fence_inflight VALUES (1, 'aisle-1', '\x00000000000000010000000000000000'::bytea, clock_timestamp() + interval '1 minute');
INSERT INTO fence_inflight VALUES (2, 'aisle-1', '\x00000000000000000000000000000001'::bytea, clock_timestamp() - interval '1 second');
\c - :app
-- READ COMMITTED: the raise waits max_wait for the write, then refuses (retryable); it kept
-- nothing.
SELECT fencing.admit('aisle-1', :'a1_era2');
\echo :SQLSTATE
SELECT fencing.mark('aisle-1');
-- SERIALIZABLE: a raise is refused outright (raise first, in READ COMMITTED) …
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT fencing.admit('aisle-1', :'a1_era2');
\echo :SQLSTATE
ROLLBACK;
\c - :gw
DELETE FROM fence_inflight WHERE id = 1;
\c - :app
SELECT fencing.admit('aisle-1', :'a1_era2');
-- … and at the mark it admits, unless a lower write is in flight (refused: it cannot wait).
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT fencing.admit('aisle-1', :'a1_era2');
COMMIT;
\c - :gw
INSERT INTO fence_inflight VALUES (3, 'aisle-1', '\x00000000000000010000000000000000'::bytea, clock_timestamp() + interval '1 minute');
\c - :app
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT fencing.admit('aisle-1', :'a1_era2');
\echo :SQLSTATE
ROLLBACK;
-- A registration of the same token does not hold a writer back.
\c - :gw
UPDATE fence_inflight SET token = '\x00000000000000020000000000000001'::bytea WHERE id = 3;
\c - :app
SELECT fencing.admit('aisle-1', :'a1_era2');
