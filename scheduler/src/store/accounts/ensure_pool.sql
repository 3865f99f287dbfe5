-- Creates an account's pool when it does not exist yet.
INSERT INTO herald.pools (namespace, name) VALUES ($1, $2) ON CONFLICT DO NOTHING
