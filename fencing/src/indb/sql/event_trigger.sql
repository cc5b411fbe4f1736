-- The event trigger that protects a table created or attached under a protected one, at once
-- (ddl_command_end of CREATE TABLE, ALTER TABLE, CREATE FOREIGN TABLE): a partition or an
-- inheritance child gets the triggers of its parent (protect.sql) in the same transaction, made
-- as the role that ran the DDL (who owns the new table), or the DDL is refused — so no table
-- under a protected one is ever without them. Made by a superuser's install only (creating an
-- event trigger needs one); `@schema@` is the package schema, `@name@` the trigger's name.
--
-- The function is the superuser's and self-contained (catalog reads and DDL; it calls nothing
-- of the package's), because it runs as whoever runs DDL — superusers included: a function the
-- package's owner could replace must not run on every superuser's CREATE TABLE. Until it finds a
-- table under a protected one it only reads the catalogs, so no other DDL in the database is
-- held up.
CREATE OR REPLACE FUNCTION @schema@._protect_added() RETURNS event_trigger
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    rel record;
    args text[];
    rest bytea;
    at int;
    name text;
BEGIN
    FOR rel IN
        WITH RECURSIVE up (relid, depth) AS (
            SELECT c.objid, 0 FROM pg_event_trigger_ddl_commands() AS c
            WHERE c.classid = 'pg_class'::regclass AND c.objsubid = 0
            UNION ALL
            SELECT i.inhparent, u.depth + 1 FROM pg_inherits AS i JOIN up AS u ON i.inhrelid = u.relid
            WHERE u.depth < 100),
        roots (relid) AS (
            SELECT DISTINCT g.tgrelid FROM up
            JOIN pg_trigger AS g ON g.tgrelid = up.relid AND g.tgname = 'fence_guard' AND g.tgparentid = 0
            JOIN pg_proc AS p ON p.oid = g.tgfoid AND p.proname = 'row_guard'
            JOIN pg_namespace AS n ON n.oid = p.pronamespace AND n.nspname = '@schema@'),
        down (relid, parent, depth) AS (
            SELECT i.inhrelid, i.inhparent, 1 FROM pg_inherits AS i JOIN roots AS r ON i.inhparent = r.relid
            UNION ALL
            SELECT i.inhrelid, i.inhparent, d.depth + 1 FROM pg_inherits AS i JOIN down AS d ON i.inhparent = d.relid
            WHERE d.depth < 100)
        SELECT d.relid::regclass AS relid, d.parent::regclass AS parent, c.relkind, c.relispartition
        FROM down AS d JOIN pg_class AS c ON c.oid = d.relid
        WHERE NOT EXISTS (SELECT FROM pg_trigger AS g WHERE g.tgrelid = d.relid
            AND g.tgname = 'fence_guard_truncate')
        ORDER BY d.depth
    LOOP
        -- Parents first: every table protect (or this function) covered has the TRUNCATE
        -- refusal; one without it takes its parent's expression.
        CONTINUE WHEN EXISTS (SELECT FROM pg_trigger AS g WHERE g.tgrelid = rel.relid
            AND g.tgname = 'fence_guard_truncate');
        IF rel.relkind NOT IN ('r', 'p') THEN
            RAISE EXCEPTION USING ERRCODE = '0AF02',
                MESSAGE = format('%s cannot be fenced: it is not a table (relkind %s), and its rows would be protected table %s''s',
                    rel.relid, rel.relkind, rel.parent);
        END IF;
        -- The parent's row trigger's arguments: NUL-terminated strings.
        SELECT g.tgargs INTO rest FROM pg_trigger AS g
            WHERE g.tgrelid = rel.parent AND g.tgname = 'fence_guard';
        args := '{}';
        LOOP
            at := position('\x00'::bytea IN rest);
            EXIT WHEN at IS NULL OR at = 0;
            args := args || convert_from(substring(rest FROM 1 FOR at - 1), getdatabaseencoding());
            rest := substring(rest FROM at + 1);
        END LOOP;
        FOR name IN SELECT g.tgname FROM pg_trigger AS g WHERE g.tgrelid = rel.relid
            AND g.tgparentid = 0 AND g.tgname IN ('fence_guard', 'fence_guard_tree')
        LOOP
            EXECUTE format('DROP TRIGGER %I ON %s', name, rel.relid);
        END LOOP;
        -- The TRUNCATE refusal first: the ALTER TABLEs below fire this trigger again, which
        -- must find the table covered.
        EXECUTE format('CREATE TRIGGER fence_guard_truncate BEFORE TRUNCATE ON %s '
            'FOR EACH STATEMENT EXECUTE FUNCTION @schema@.refuse_truncate()', rel.relid);
        IF NOT rel.relispartition THEN
            EXECUTE format('CREATE TRIGGER fence_guard AFTER INSERT OR UPDATE OR DELETE ON %s '
                'FOR EACH ROW EXECUTE FUNCTION @schema@.row_guard(%L, %L, %L%s)', rel.relid, args[1],
                coalesce(args[2], format('SELECT (%s)::text FROM (SELECT ($1).*) AS fenced_row', args[1])),
                coalesce(args[3], 'pinned'),
                CASE WHEN args[4] IS NULL THEN '' ELSE format(', %L', args[4]) END);
        END IF;
        IF rel.relkind = 'r' AND NOT rel.relispartition THEN
            EXECUTE format('CREATE TRIGGER fence_guard_tree BEFORE UPDATE OR DELETE ON %s '
                'FOR EACH STATEMENT EXECUTE FUNCTION @schema@.tree_guard()', rel.relid);
        END IF;
        FOR name IN SELECT g.tgname FROM pg_trigger AS g WHERE g.tgrelid = rel.relid
            AND g.tgenabled <> 'A' AND g.tgname IN ('fence_guard', 'fence_guard_truncate', 'fence_guard_tree')
        LOOP
            EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER %I', rel.relid, name);
        END LOOP;
    END LOOP;
END
$$;
REVOKE ALL ON FUNCTION @schema@._protect_added() FROM PUBLIC;
