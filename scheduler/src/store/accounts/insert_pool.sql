-- Creates a pool.
INSERT INTO herald.pools (namespace, name, description, sticky) VALUES ($1, $2, $3, $4)
