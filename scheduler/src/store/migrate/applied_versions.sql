-- The numbered migrations already applied.
SELECT version FROM herald.schema_migrations
