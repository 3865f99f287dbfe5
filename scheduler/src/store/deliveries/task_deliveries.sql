-- The delivery of each task among $1 (namespace $2), folded from its reports: the furthest
-- state any report reached, the first time of each state, the failure's code and text, and
-- the message id (the accepted send's, else the first report's). $3 false: the task's current
-- message (herald.task_reports); true: the message its window-closed fallback replaced
-- (migration 25), if any.
SELECT e.task_id,
       max(e.state) AS state,
       (array_agg(e.provider_message_id ORDER BY e.state, e.recorded_at))[1]
           AS provider_message_id,
       min(e.occurred_at) FILTER (WHERE e.state = 1) AS accepted_at,
       min(e.occurred_at) FILTER (WHERE e.state = 2) AS delivered_at,
       min(e.occurred_at) FILTER (WHERE e.state = 3) AS read_at,
       min(e.occurred_at) FILTER (WHERE e.state = 4) AS failed_at,
       (array_agg(e.error_code ORDER BY e.occurred_at) FILTER (WHERE e.state = 4))[1]
           AS error_code,
       (array_agg(e.error ORDER BY e.occurred_at) FILTER (WHERE e.state = 4))[1] AS error
FROM herald.task_records t
CROSS JOIN LATERAL (
    SELECT r.* FROM herald.task_reports(t.id, t.lease_count, t.fallback_replaces) r WHERE NOT $3::boolean
    UNION ALL
    SELECT r.* FROM herald.delivery_events r
    WHERE $3::boolean AND r.task_id = t.id AND r.provider_message_id = t.fallback_replaces
) e
WHERE t.id = ANY($1::uuid[]) AND t.namespace = $2
GROUP BY e.task_id
