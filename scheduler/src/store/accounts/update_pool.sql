-- Changes a pool's description.
UPDATE herald.pools SET description = $3 WHERE namespace = $1 AND name = $2
