-- Records delivery reports of namespace $7, each once per (message id, state). The task is the
-- callback data's ($3) when that task exists in the namespace, else the one an earlier report
-- of the same message was tied to. A repeat changes nothing, except that it ties a report
-- recorded without a task to the task it names, and that an earlier time wins: the send's
-- report records ACCEPTED at its arrival, and Meta's `sent` status coming after it says when
-- Meta took the message (api.md: `accepted_at` is the earlier of the two). Returns the reports
-- that were new, newly tied or moved earlier, with their task.
WITH input AS (
    SELECT *
    FROM unnest($1::text[], $2::smallint[], $3::uuid[], $4::timestamptz[], $5::bigint[],
                $6::text[]) WITH ORDINALITY
        AS i(provider_message_id, state, task_id, occurred_at, error_code, error, n)
),
resolved AS (
    -- One row per key: ON CONFLICT may not touch the same row twice in one statement.
    SELECT DISTINCT ON (i.provider_message_id, i.state)
           i.provider_message_id, i.state, COALESCE(t.id, known.task_id) AS task_id,
           COALESCE(i.occurred_at, herald.now()) AS occurred_at, i.error_code, i.error
    FROM input i
    LEFT JOIN herald.task_records t ON t.id = i.task_id AND t.namespace = $7
    LEFT JOIN LATERAL (
        SELECT e.task_id
        FROM herald.delivery_events e
        WHERE e.namespace = $7 AND e.provider_message_id = i.provider_message_id
          AND e.task_id IS NOT NULL
        LIMIT 1
    ) known ON true
    ORDER BY i.provider_message_id, i.state, i.n
)
INSERT INTO herald.delivery_events AS e
    (namespace, provider_message_id, state, task_id, occurred_at, error_code, error)
SELECT $7, r.provider_message_id, r.state, r.task_id, r.occurred_at, r.error_code, r.error
FROM resolved r
ON CONFLICT (namespace, provider_message_id, state) DO UPDATE
SET task_id = COALESCE(e.task_id, EXCLUDED.task_id),
    occurred_at = least(e.occurred_at, EXCLUDED.occurred_at)
-- Only a report without a task learns one, and only an earlier time replaces a later one; any
-- other repeat is left alone (and not returned).
WHERE (e.task_id IS NULL AND EXCLUDED.task_id IS NOT NULL)
   OR EXCLUDED.occurred_at < e.occurred_at
RETURNING e.provider_message_id, e.state, e.task_id
