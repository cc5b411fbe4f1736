-- Package version 2: remembered verdicts. Applied once, in the installing transaction, by the
-- package's owner role. `@schema@` is the package schema.

-- A token that verified for a resource, remembered so that its holder's next transactions skip
-- the verification (`_recall`, `_verified` in functions.sql). A row says only "this exact wire
-- text is signed for this resource by this key"; the mark is compared on every admit as before.
-- Written only by the owner's functions (no role is granted anything on it: grants.sql); keyed
-- by the resource and the SHA-256 of the wire text's exact bytes (no token is stored); `kid`
-- references the key row the token verified under, so that `pg sync-keys` (which deletes and
-- re-inserts every key) deletes every remembered verdict with it, and an admit verifying under
-- a key holds that key row until it commits (`_verified`). UNLOGGED: after a crash it is empty,
-- and tokens are verified again.
CREATE UNLOGGED TABLE @schema@.verdicts (
    resource text NOT NULL,
    digest bytea NOT NULL CHECK (length(digest) = 32),
    kid text NOT NULL REFERENCES @schema@.keys (kid) ON DELETE CASCADE ON UPDATE CASCADE,
    token bytea NOT NULL CHECK (length(token) = 16),
    shown text NOT NULL,
    PRIMARY KEY (resource, digest)
);
CREATE INDEX verdicts_by_kid ON @schema@.verdicts (kid);
