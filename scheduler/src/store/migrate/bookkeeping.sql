-- The tables that record which migrations ran (numbered ones by version, repeatable ones by
-- the checksum of the text applied last).
CREATE SCHEMA IF NOT EXISTS herald;
CREATE TABLE IF NOT EXISTS herald.schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS herald.schema_repeatables (
    name       text PRIMARY KEY,
    checksum   bytea NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
