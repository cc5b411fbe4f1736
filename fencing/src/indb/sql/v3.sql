-- Package version 3: remembered verdicts keyed by the wire text itself instead of its SHA-256.
-- Applied once, in the installing transaction, by the package's owner role. `@schema@` is the
-- package schema.
--
-- The digest cost more than the rest of a remembered admit's lookup (PostgreSQL's `sha256()`
-- sets up its hash context anew in every transaction), and hid nothing from anyone: only the
-- owner can read the table, and the owner reads the signing keys beside it, with which any
-- token can be made. Text compares byte for byte under the database's default collation (a
-- deterministic one), which is the collation every lookup uses. Verdicts are only a cache: the
-- old rows go, and each token is verified once more.
TRUNCATE @schema@.verdicts;
ALTER TABLE @schema@.verdicts
    DROP CONSTRAINT verdicts_pkey,
    DROP COLUMN digest,
    ADD COLUMN wire text NOT NULL CHECK (octet_length(wire) <= 256);
ALTER TABLE @schema@.verdicts ADD CONSTRAINT verdicts_pkey PRIMARY KEY (resource, wire);
