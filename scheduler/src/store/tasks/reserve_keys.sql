-- Reserves idempotency keys for new tasks. A key that already exists (or appears twice in the
-- batch) is skipped here and resolved against the stored request hash by the caller; a
-- concurrent insert of the same key waits for the other transaction and then skips.
INSERT INTO herald.idempotency_keys (namespace, key, task_id, request_hash)
SELECT $1, k.key, k.task_id, k.request_hash
FROM unnest($2::text[], $3::uuid[], $4::bytea[]) AS k(key, task_id, request_hash)
ON CONFLICT (namespace, key) DO NOTHING
RETURNING key
