-- Package version 1: the tables. Applied once, in the installing transaction, by the package's
-- owner role. `@schema@` is the package schema, `@crypto@` the schema holding pgcrypto.

-- Marks and in-flight registrations: exactly the tables (and encoding) of fence-gateway's
-- PostgreSQL store (fencing/src/store/postgres/mod.rs), so HTTP-fenced and SQL-fenced writers
-- share one mark per resource. `IF NOT EXISTS`: the install may have adopted the gateway's own.
CREATE TABLE IF NOT EXISTS @schema@.fence_marks (
    resource text PRIMARY KEY,
    mark bytea NOT NULL CHECK (length(mark) = 16)
);
CREATE TABLE IF NOT EXISTS @schema@.fence_inflight (
    id bigint PRIMARY KEY,
    resource text NOT NULL,
    token bytea NOT NULL CHECK (length(token) = 16),
    expires_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS fence_inflight_by_resource ON @schema@.fence_inflight (resource, token);
CREATE TABLE IF NOT EXISTS @schema@.fence_probe (
    id smallint PRIMARY KEY CHECK (id = 1),
    probed_at timestamptz NOT NULL
);

-- The verification keys, as in the key file (`pg sync-keys` replaces them whole).
CREATE TABLE @schema@.keys (
    kid text PRIMARY KEY CHECK (kid ~ '^[A-Za-z0-9_-]{1,32}$'),
    secret bytea NOT NULL CHECK (length(secret) >= 32),
    position int NOT NULL UNIQUE
);

-- One row. `max_wait`: how long a READ COMMITTED admit waits for a gateway's lower-token writes
-- in flight. `compare_key`: a random key under which MACs are compared (see `_verify`).
CREATE TABLE @schema@.settings (
    id smallint PRIMARY KEY CHECK (id = 1),
    max_wait interval NOT NULL DEFAULT interval '10 seconds',
    compare_key bytea NOT NULL CHECK (length(compare_key) = 32)
);
INSERT INTO @schema@.settings (id, compare_key) VALUES (1, @crypto@.gen_random_bytes(32));
