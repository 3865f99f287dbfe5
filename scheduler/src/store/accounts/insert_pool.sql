-- Creates a pool.
INSERT INTO herald.pools (namespace, name, description) VALUES ($1, $2, $3)
