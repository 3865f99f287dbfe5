-- Records the text of a repeatable migration as applied, in its own transaction.
INSERT INTO herald.schema_repeatables (name, checksum) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET checksum = $2, applied_at = now()
