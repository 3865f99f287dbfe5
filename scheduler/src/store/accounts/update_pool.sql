-- Changes a pool's description and stickiness.
UPDATE herald.pools SET description = $3, sticky = $4 WHERE namespace = $1 AND name = $2
