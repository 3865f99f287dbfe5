SELECT key, task_id, request_hash
FROM herald.idempotency_keys
WHERE namespace = $1 AND key = ANY($2::text[])
