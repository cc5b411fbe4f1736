-- Privileges, set again by every install (as the package's owner role). Nothing of the package
-- is PUBLIC: marks, registrations and keys are the owner's; writers (`--writer`) may call the
-- admitting functions and protect tables; gateways (`--gateway-role`) use the store's tables
-- directly, as fence-gateway's PostgreSQL store does. See docs/POSTGRES.md.
REVOKE ALL ON SCHEMA @schema@ FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA @schema@ FROM PUBLIC;
REVOKE ALL ON FUNCTION
    @schema@._be8(numeric), @schema@._token_text(bytea), @schema@._is_resource(text),
    @schema@._quoted_name(text), @schema@._unpreparable(),
    @schema@._verify(text, text), @schema@._recall(text, text), @schema@._verified(text, text),
    @schema@._order(text, bytea),
    @schema@.admit(text, text), @schema@.admit_presented(text), @schema@.mark(text),
    @schema@.replace_keys(text[], bytea[]), @schema@.key_ids(),
    @schema@.protect(regclass, text), @schema@.unprotect(regclass),
    @schema@._resource_of(text, record), @schema@._resources_of(text, record, record),
    @schema@._tree(regclass),
    @schema@._unguarded_under(regclass), @schema@._unguard(regclass),
    @schema@._guard(regclass, text, text, text, boolean), @schema@._enable(regclass)
FROM PUBLIC;
-- Trigger functions cannot be called directly; a table owner needs EXECUTE to create the trigger.
GRANT EXECUTE ON FUNCTION @schema@.row_guard(), @schema@.refuse_truncate(), @schema@.tree_guard()
TO PUBLIC;
