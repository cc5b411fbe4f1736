-- Attacks on protected tables from psql, one session after another in one process
-- (fencing/tests/pg_hostile.rs runs it and compares the output with hostile.out).
-- Variables: roles :app (a writer), :table_owner; tokens minted by fencing::Keyring.
\set VERBOSITY terse
\set SHOW_CONTEXT never
\pset pager off

-- 1. Partitions and inheritance children hold the protected table's rows: each is fenced.
\c - :table_owner
CREATE TABLE events (aisle text NOT NULL, n int) PARTITION BY LIST (aisle);
CREATE TABLE events_1 PARTITION OF events FOR VALUES IN ('aisle-1');
CREATE TABLE stock (aisle text NOT NULL, n int);
CREATE TABLE stock_east () INHERITS (stock);
GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON events, events_1, stock, stock_east TO :app;
SELECT fencing.protect('events', 'aisle');
SELECT fencing.protect('stock', 'aisle');
\c - :app
-- The new holder (token 7) writes.
BEGIN;
SET LOCAL fencing.token = :'a1_7';
INSERT INTO events VALUES ('aisle-1', 7);
INSERT INTO stock_east VALUES ('aisle-1', 7);
COMMIT;
-- Without a token, or with the old holder's, every path to those rows is refused.
DELETE FROM events_1;
\echo :SQLSTATE
UPDATE stock SET n = 5;
\echo :SQLSTATE
UPDATE stock_east SET n = 5;
\echo :SQLSTATE
BEGIN;
SET LOCAL fencing.token = :'a1_5';
UPDATE stock SET n = 5;
\echo :SQLSTATE
ROLLBACK;
TRUNCATE events_1;
\echo :SQLSTATE
TRUNCATE stock_east;
\echo :SQLSTATE
TRUNCATE stock;
\echo :SQLSTATE
SELECT * FROM events;
SELECT * FROM stock;

-- 2. Tables added under a protected table later, by its owner: a partition's rows are fenced by
-- the row trigger PostgreSQL clones onto it; an inheritance child refuses every UPDATE or
-- DELETE through the protected table until protect runs again, which covers both.
\c - :table_owner
CREATE TABLE events_2 PARTITION OF events FOR VALUES IN ('aisle-2');
CREATE TABLE stock_west (aisle text NOT NULL, n int);
INSERT INTO stock_west VALUES ('aisle-2', 1);
ALTER TABLE stock_west INHERIT stock;
GRANT SELECT, INSERT, UPDATE, DELETE ON events_2, stock_west TO :app;
\c - :app
INSERT INTO events VALUES ('aisle-2', 1);
\echo :SQLSTATE
BEGIN;
SET LOCAL fencing.token = :'a1_7';
UPDATE stock SET n = 8 WHERE aisle = 'aisle-1';
\echo :SQLSTATE
ROLLBACK;
\c - :table_owner
SELECT fencing.protect('events', 'aisle');
SELECT fencing.protect('stock', 'aisle');
SELECT tgrelid::regclass AS "table", tgname, tgenabled FROM pg_trigger
    WHERE tgrelid IN ('events'::regclass, 'events_1'::regclass, 'events_2'::regclass,
        'stock'::regclass, 'stock_east'::regclass, 'stock_west'::regclass)
    ORDER BY 1, 2;
TRUNCATE events_2;
\echo :SQLSTATE
\c - :app
UPDATE stock_west SET n = 5;
\echo :SQLSTATE
BEGIN;
SET LOCAL fencing.token = :'a1_7';
UPDATE stock SET n = 8 WHERE aisle = 'aisle-1';
COMMIT;
-- unprotect removes what protect made, on every table under it.
\c - :table_owner
SELECT fencing.unprotect('stock');
SELECT count(*) AS triggers_left FROM pg_trigger
    WHERE tgrelid IN ('stock'::regclass, 'stock_east'::regclass, 'stock_west'::regclass);
SELECT fencing.protect('stock', 'aisle');

-- 3. The resource expression means one resource per row, whatever the writer's settings.
\c - :table_owner
CREATE TABLE days (day date PRIMARY KEY, note text);
CREATE TABLE slots (at timestamptz PRIMARY KEY, note text);
GRANT SELECT, INSERT, UPDATE ON days, slots TO :app;
SELECT fencing.protect('days', $$ 'day-' || day $$);
SELECT fencing.protect('slots', $$ 'slot-' || to_char(at, 'YYYYMMDD"T"HH24MI') $$);
\c - :app
BEGIN;
SET LOCAL fencing.token = :'day_7';
INSERT INTO days VALUES ('2026-12-06', 'new holder');
COMMIT;
BEGIN;
SET LOCAL fencing.token = :'day_5';
UPDATE days SET note = 'old holder' WHERE day = '2026-12-06';
\echo :SQLSTATE
ROLLBACK;
-- The old holder, with a genuine token for another resource it may lease, under German dates.
SET DateStyle = German;
BEGIN;
SET LOCAL fencing.token = :'day_german';
UPDATE days SET note = 'old holder' WHERE day = '2026-12-06';
\echo :SQLSTATE
COMMIT;
RESET DateStyle;
SET TimeZone = 'Asia/Tokyo';
BEGIN;
SET LOCAL fencing.token = :'slot_tokyo';
INSERT INTO slots VALUES ('2026-12-06 00:00:00+00', 'in Tokyo');
\echo :SQLSTATE
ROLLBACK;
BEGIN;
SET LOCAL fencing.token = :'slot_utc';
INSERT INTO slots VALUES ('2026-12-06 00:00:00+00', 'in UTC');
COMMIT;
RESET TimeZone;
SELECT * FROM days;
SELECT fencing.mark('day-2026-12-06') AS iso, fencing.mark('day-06.12.2026') AS german;

-- 4. An explicit admit in a trigger-mode transaction: the trigger finds its token.
BEGIN;
SELECT fencing.admit('aisle-1', :'a1_7');
INSERT INTO stock VALUES ('aisle-1', 9);
COMMIT;
BEGIN;
SELECT fencing.admit('aisle-1', :'a1_7');
SELECT fencing.admit('aisle-1', :'a1_7');
SELECT current_setting('fencing.token') = :'a1_7' AS claimed_once;
ROLLBACK;
SELECT * FROM stock ORDER BY n;
