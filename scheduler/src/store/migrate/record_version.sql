-- Records a numbered migration as applied, in its own transaction.
INSERT INTO herald.schema_migrations (version, name) VALUES ($1, $2)
