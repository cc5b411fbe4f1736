-- Trigger mode (docs/POSTGRES.md, "Writing fenced"): what `protect` puts on a table and on
-- every table under it, (re)created by every install after functions.sql, as the package's
-- owner role. `@schema@` is the package schema.
--
-- A protected table's rows may live in other tables: its partitions, and the tables that
-- inherit from it (an UPDATE or DELETE of the parent reaches their rows, and PostgreSQL fires
-- the child's row triggers for them, not the parent's; TRUNCATE of a partition fires only the
-- partition's triggers). So every table under a protected one carries the same triggers:
--   fence_guard           AFTER INSERT OR UPDATE OR DELETE, FOR EACH ROW: row_guard — on a
--                         partition, PostgreSQL's clone of its parent's (made for every
--                         partition, present and future);
--   fence_guard_truncate  BEFORE TRUNCATE: refuse_truncate (0AF01);
--   fence_guard_tree      BEFORE UPDATE OR DELETE, FOR EACH STATEMENT, on ordinary tables (the
--                         only ones that can gain inheritance children): tree_guard refuses
--                         (55F02) while a table under it lacks these triggers;
-- all ENABLE ALWAYS. A table added under a protected one later is covered by protect run again,
-- or at once by the event trigger a superuser's install creates (event_trigger.sql).

-- Evaluates a protected table's resource expression for two rows: `query` (from protect or
-- row_guard, over the rows `$1` and `$2`, two columns) under fixed settings, so that one row
-- means one resource whoever writes it. `::text` of a date, time, interval, float, money or
-- bytea, and the parsing of literals and strings, follow the session's settings otherwise: a
-- writer could make a row's resource the name of another resource it holds a token for (`SET
-- DateStyle = German`: 'day-06.12.2026' for 'day-2026-12-06'). Not `timezone_abbreviations`
-- (loading its file costs ~0.2 ms a row): an expression that parses abbreviated time zones from
-- text is the one still read under the writer's choice.
CREATE OR REPLACE FUNCTION @schema@._resources_of(
    query text, r1 record, r2 record, OUT first text, OUT second text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @schema@, pg_temp
SET DateStyle = 'ISO, MDY' SET IntervalStyle = 'postgres' SET TimeZone = 'UTC'
SET extra_float_digits = 1 SET bytea_output = 'hex'
SET lc_monetary = 'C' SET lc_numeric = 'C' SET lc_time = 'C'
SET standard_conforming_strings = on SET array_nulls = on SET transform_null_equals = off
SET quote_all_identifiers = off SET xmlbinary = 'base64' SET xmloption = 'content'
SET default_text_search_config = 'pg_catalog.simple' AS $$
BEGIN
    EXECUTE query INTO first, second USING r1, r2;
END
$$;

-- One row's resource (`query` over the row `$1`), as `_resources_of` evaluates it: the query
-- as a scalar subquery beside a NULL second column — its first row, NULL for none, as
-- `EXECUTE … INTO` gives. No `SET search_path` (a second save and restore of the setting on a
-- row trigger's path): every name in it is schema-qualified, so no caller's path can change
-- what it runs, and it runs as its caller, so a writer calling it directly gains nothing.
CREATE OR REPLACE FUNCTION @schema@._resource_of(query text, r record) RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN (SELECT s.first FROM @schema@._resources_of(
        pg_catalog.format('SELECT (%s LIMIT 1), NULL::text', query), r, r) AS s);
END
$$;

-- The row trigger (AFTER, so it checks the row as written, after every BEFORE trigger).
-- TG_ARGV[0] is the resource expression over the row's columns, TG_ARGV[1] the query that
-- evaluates it for the row `$1`, TG_ARGV[2] how: 'text' for a column of a text type, read as it
-- is (no setting changes it), 'pinned' for anything else (`_resource_of`); TG_ARGV[3] the query
-- that evaluates it for the rows `$1` and `$2` at once (an UPDATE's new and old row: one
-- dynamic statement planned instead of two). Triggers made by older versions lack some of
-- them: the general query, pinned, one row at a time.
CREATE OR REPLACE FUNCTION @schema@.row_guard() RETURNS trigger
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, @schema@, pg_temp AS $$
DECLARE
    query text := CASE WHEN TG_NARGS > 1 THEN TG_ARGV[1]
        ELSE format('SELECT (%s)::text FROM (SELECT ($1).*) AS fenced_row', TG_ARGV[0]) END;
    as_text boolean := TG_NARGS > 2 AND TG_ARGV[2] = 'text';
    new_resource text;
    old_resource text;
BEGIN
    IF TG_OP = 'UPDATE' AND TG_NARGS > 3 THEN
        IF as_text THEN
            EXECUTE TG_ARGV[3] INTO new_resource, old_resource USING NEW, OLD;
        ELSE
            SELECT r.first, r.second INTO new_resource, old_resource
                FROM @schema@._resources_of(TG_ARGV[3], NEW, OLD) AS r;
        END IF;
        PERFORM @schema@.admit_presented(new_resource);
        IF old_resource IS DISTINCT FROM new_resource THEN
            PERFORM @schema@.admit_presented(old_resource);
        END IF;
        RETURN NULL;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        IF as_text THEN
            EXECUTE query INTO new_resource USING NEW;
        ELSE
            new_resource := @schema@._resource_of(query, NEW);
        END IF;
        PERFORM @schema@.admit_presented(new_resource);
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        IF as_text THEN
            EXECUTE query INTO old_resource USING OLD;
        ELSE
            old_resource := @schema@._resource_of(query, OLD);
        END IF;
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

-- `root` and every table under it (partitions and inheritance children, at any depth), each
-- once, parents before children: its kind, whether it is a partition, and one parent.
CREATE OR REPLACE FUNCTION @schema@._tree(root regclass)
RETURNS TABLE (relid regclass, relkind "char", relispartition boolean, parent regclass, depth int)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    WITH RECURSIVE tree (relid, parent, depth) AS (
        SELECT root::oid, NULL::oid, 0
        UNION ALL
        SELECT i.inhrelid, i.inhparent, t.depth + 1
        FROM pg_inherits AS i JOIN tree AS t ON i.inhparent = t.relid
        WHERE t.depth < 100)
    SELECT DISTINCT ON (t.relid) t.relid::regclass, c.relkind, c.relispartition,
        t.parent::regclass, t.depth
    FROM tree AS t JOIN pg_class AS c ON c.oid = t.relid
    ORDER BY t.relid, t.depth DESC
$$;

-- The first table under `root` (not `root` itself) that lacks one of the triggers of a table
-- under a protected one (see the top of this file), NULL if none. Catalog reads only.
CREATE OR REPLACE FUNCTION @schema@._unguarded_under(root regclass) RETURNS regclass
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    WITH RECURSIVE tree (relid, depth) AS (
        SELECT i.inhrelid, 1 FROM pg_inherits AS i WHERE i.inhparent = root
        UNION ALL
        SELECT i.inhrelid, t.depth + 1 FROM pg_inherits AS i JOIN tree AS t ON i.inhparent = t.relid
        WHERE t.depth < 100),
    ours (tgrelid, tgname) AS (
        SELECT g.tgrelid, g.tgname FROM pg_trigger AS g
        JOIN pg_proc AS p ON p.oid = g.tgfoid
        JOIN pg_namespace AS n ON n.oid = p.pronamespace AND n.nspname = '@schema@'
        WHERE g.tgenabled = 'A' AND g.tgrelid IN (SELECT relid FROM tree)
          AND (g.tgname, p.proname) IN (('fence_guard', 'row_guard'),
              ('fence_guard_truncate', 'refuse_truncate'), ('fence_guard_tree', 'tree_guard')))
    SELECT t.relid::regclass FROM tree AS t JOIN pg_class AS c ON c.oid = t.relid
    WHERE NOT (EXISTS (SELECT FROM ours AS o WHERE o.tgrelid = t.relid AND o.tgname = 'fence_guard')
        AND EXISTS (SELECT FROM ours AS o WHERE o.tgrelid = t.relid AND o.tgname = 'fence_guard_truncate')
        AND (c.relkind <> 'r' OR c.relispartition
             OR EXISTS (SELECT FROM ours AS o WHERE o.tgrelid = t.relid AND o.tgname = 'fence_guard_tree')))
    ORDER BY t.depth
    LIMIT 1
$$;

-- The statement trigger of a protected ordinary table (and of every ordinary table under it).
-- Only a table with children (relhassubclass, one catalog row) pays for more than that lookup.
CREATE OR REPLACE FUNCTION @schema@.tree_guard() RETURNS trigger
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, @schema@, pg_temp AS $$
DECLARE
    bare regclass;
BEGIN
    IF (SELECT c.relhassubclass FROM pg_class AS c WHERE c.oid = TG_RELID) THEN
        bare := @schema@._unguarded_under(TG_RELID);
        IF bare IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = '55F02',
                MESSAGE = format('%s is under protected table %s but is not protected itself: an %s of %s could reach its rows unfenced',
                    bare, TG_RELID::regclass, TG_OP, TG_RELID::regclass),
                HINT = 'Run fencing.protect on the protected table again: it protects every table under it.';
        END IF;
    END IF;
    RETURN NULL;
END
$$;

-- Drops the triggers protect made on `rel` (a partition's clones go with their parent's).
CREATE OR REPLACE FUNCTION @schema@._unguard(rel regclass) RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    name text;
BEGIN
    FOR name IN SELECT g.tgname FROM pg_trigger AS g
        WHERE g.tgrelid = rel AND g.tgparentid = 0
          AND g.tgname IN ('fence_guard', 'fence_guard_truncate', 'fence_guard_tree')
    LOOP
        EXECUTE format('DROP TRIGGER %I ON %s', name, rel);
    END LOOP;
END
$$;

-- Puts the triggers of a protected table on `rel` (see the top of this file): the TRUNCATE
-- refusal first, the row trigger unless `rel` is a partition whose parent has it (PostgreSQL's
-- clone), the statement trigger on an ordinary table. CREATE TRIGGER only: the ALTER TABLE that
-- enables them (`_enable`) comes once every table of the tree has its TRUNCATE refusal, which
-- is what the event trigger, fired by ALTER TABLE, takes for "covered". Run as the owner.
CREATE OR REPLACE FUNCTION @schema@._guard(
    rel regclass, expression text, query text, how text, cloned boolean) RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, @schema@, pg_temp AS $$
DECLARE
    -- The same for `$1` and `$2` in one statement (row_guard's TG_ARGV[3]); `LIMIT 1` and a
    -- scalar subquery give what `EXECUTE … INTO` gives of the one-row query: its first row,
    -- NULL for none. (Derived here, not passed: the signature stays the one writers were
    -- granted, so that nothing of theirs that depends on it can stop an upgrade.)
    two_rows text := CASE WHEN query = format('SELECT ($1).%I::text', expression)
        THEN format('SELECT ($1).%I::text, ($2).%I::text', expression, expression)
        ELSE format('SELECT (SELECT (%s)::text FROM (SELECT ($1).*) AS fenced_row LIMIT 1), '
            '(SELECT (%s)::text FROM (SELECT ($2).*) AS fenced_row LIMIT 1)',
            expression, expression) END;
    kind "char" := (SELECT c.relkind FROM pg_class AS c WHERE c.oid = rel);
    partition boolean := (SELECT c.relispartition FROM pg_class AS c WHERE c.oid = rel);
BEGIN
    IF kind NOT IN ('r', 'p') THEN
        RAISE EXCEPTION USING ERRCODE = '0AF02',
            MESSAGE = format('%s cannot be fenced: it is not a table (relkind %s), and its rows would be a protected table''s',
                rel, kind),
            HINT = 'Detach it (or take it out of the inheritance) before protecting the table above it.';
    END IF;
    EXECUTE format('CREATE TRIGGER fence_guard_truncate BEFORE TRUNCATE ON %s '
        'FOR EACH STATEMENT EXECUTE FUNCTION @schema@.refuse_truncate()', rel);
    IF NOT cloned THEN
        EXECUTE format('CREATE TRIGGER fence_guard AFTER INSERT OR UPDATE OR DELETE ON %s '
            'FOR EACH ROW EXECUTE FUNCTION @schema@.row_guard(%L, %L, %L, %L)',
            rel, expression, query, how, two_rows);
    ELSIF NOT EXISTS (SELECT FROM pg_trigger AS g WHERE g.tgrelid = rel AND g.tgname = 'fence_guard') THEN
        RAISE EXCEPTION 'protect: partition % has no clone of its parent''s fence_guard trigger', rel;
    END IF;
    IF kind = 'r' AND NOT partition THEN
        EXECUTE format('CREATE TRIGGER fence_guard_tree BEFORE UPDATE OR DELETE ON %s '
            'FOR EACH STATEMENT EXECUTE FUNCTION @schema@.tree_guard()', rel);
    END IF;
END
$$;

-- ENABLE ALWAYS for each trigger `_guard` put on `rel`: session_replication_role = replica
-- does not skip them.
CREATE OR REPLACE FUNCTION @schema@._enable(rel regclass) RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    name text;
BEGIN
    FOR name IN SELECT g.tgname FROM pg_trigger AS g WHERE g.tgrelid = rel AND g.tgenabled <> 'A'
        AND g.tgname IN ('fence_guard', 'fence_guard_truncate', 'fence_guard_tree')
    LOOP
        EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER %I', rel, name);
    END LOOP;
END
$$;

-- Protects a table: every row INSERT, UPDATE (the old and the new row's resource) and DELETE
-- must be admitted (admit_presented) for the resource `resource_expression` gives for that row;
-- TRUNCATE is refused. The same for every table under it (partitions, inheritance children).
-- The triggers fire ALWAYS, whatever session_replication_role says. Run by the tables' owner
-- (it alone may create and enable the triggers); protecting again replaces the expression and
-- covers tables added under it since.
CREATE OR REPLACE FUNCTION @schema@.protect(tbl regclass, resource_expression text) RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, @schema@, pg_temp
    SET client_min_messages = warning AS $$
DECLARE
    -- A bare column name (one that means the same unquoted: lowercase, no keyword such as
    -- `current_user`) is read from the row (`($1).column`, a query a third as costly to plan as
    -- the general one; the trigger plans it for every row), and a text column's value as it is.
    column_type regtype := (SELECT a.atttypid FROM pg_attribute AS a
        WHERE quote_ident(resource_expression) = resource_expression
          AND a.attrelid = tbl AND a.attname = resource_expression AND a.attnum > 0
          AND NOT a.attisdropped);
    query text := CASE WHEN column_type IS NOT NULL
        THEN format('SELECT ($1).%I::text', resource_expression)
        ELSE format('SELECT (%s)::text FROM (SELECT ($1).*) AS fenced_row', resource_expression) END;
    how text := CASE WHEN column_type IN ('text'::regtype, 'character varying'::regtype,
        'character'::regtype, 'name'::regtype) THEN 'text' ELSE 'pinned' END;
    rel record;
BEGIN
    -- Checks the expression against the row type now, not at the first write.
    EXECUTE format('SELECT (%s)::text FROM (SELECT (NULL::%s).*) AS fenced_row', resource_expression, tbl);
    FOR rel IN SELECT t.relid FROM @schema@._tree(tbl) AS t LOOP
        PERFORM @schema@._unguard(rel.relid);
    END LOOP;
    FOR rel IN SELECT t.relid, t.relispartition FROM @schema@._tree(tbl) AS t ORDER BY t.depth LOOP
        PERFORM @schema@._guard(rel.relid, resource_expression, query, how,
            rel.relid <> tbl AND rel.relispartition);
    END LOOP;
    FOR rel IN SELECT t.relid FROM @schema@._tree(tbl) AS t ORDER BY t.depth LOOP
        PERFORM @schema@._enable(rel.relid);
    END LOOP;
END
$$;

-- Removes what protect installed on the table and every table under it (run by their owner).
CREATE OR REPLACE FUNCTION @schema@.unprotect(tbl regclass) RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, @schema@, pg_temp
    SET client_min_messages = warning AS $$
DECLARE
    rel record;
BEGIN
    FOR rel IN SELECT t.relid FROM @schema@._tree(tbl) AS t LOOP
        PERFORM @schema@._unguard(rel.relid);
    END LOOP;
END
$$;
