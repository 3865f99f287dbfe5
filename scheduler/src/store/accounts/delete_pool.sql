-- Deletes a pool; the caller checked it has no accounts and no waiting tasks.
DELETE FROM herald.pools WHERE namespace = $1 AND name = $2
