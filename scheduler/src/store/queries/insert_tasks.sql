-- Inserts a batch of validated tasks in one statement; arrays are columns, one element a task.
-- A task with no explicit run_at is due `delay_ms` after the database's now(), so every due
-- time is on the database clock.
INSERT INTO herald.tasks (
    id, namespace, queue, recipient, content, template_id, labels, priority, run_at, expire_at,
    idempotency_key, max_attempts, retry_delays_ms, backoff_initial_ms, backoff_max_ms,
    backoff_multiplier, backoff_jitter, pool, account_id, route, trace_parent)
SELECT i.id, $1, i.queue, i.recipient, i.content, i.template_id, i.labels, i.priority,
       COALESCE(i.run_at, now() + i.delay_ms * interval '1 millisecond'), i.expire_at,
       i.idempotency_key, i.max_attempts,
       CASE WHEN i.retry_delays = '' THEN '{}'::bigint[]
            ELSE string_to_array(i.retry_delays, ',')::bigint[] END,
       i.backoff_initial_ms, i.backoff_max_ms, i.backoff_multiplier, i.backoff_jitter,
       i.pool, i.account_id,
       $1 || '/' || CASE WHEN i.account_id IS NOT NULL THEN 'a:' || i.account_id
                         WHEN i.pool IS NOT NULL THEN 'p:' || i.pool
                         ELSE '' END,
       i.trace_parent
FROM unnest($2::uuid[], $3::text[], $4::text[], $5::bytea[], $6::text[], $7::jsonb[],
            $8::smallint[], $9::timestamptz[], $10::bigint[], $11::timestamptz[], $12::text[],
            $13::integer[], $14::text[], $15::bigint[], $16::bigint[], $17::float8[],
            $18::float8[], $19::text[], $20::text[], $21::text[])
    AS i(id, queue, recipient, content, template_id, labels, priority, run_at, delay_ms,
         expire_at, idempotency_key, max_attempts, retry_delays, backoff_initial_ms,
         backoff_max_ms, backoff_multiplier, backoff_jitter, pool, account_id, trace_parent)
RETURNING run_at
