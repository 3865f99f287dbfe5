-- The delivery of each task among $1 (namespace $2), folded from its reports: the furthest
-- state any report reached, the first time of each state, the failure's code and text, and
-- the message id (the accepted send's, else the first report's). $3 false: the task's current
-- message (not one an earlier attempt sent before the task was retried); true: the message its
-- window-closed fallback replaced (migration 25), if any.
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
FROM herald.delivery_events e
JOIN herald.tasks t ON t.id = e.task_id
WHERE e.task_id = ANY($1::uuid[]) AND e.namespace = $2
  AND (e.provider_message_id IS NOT DISTINCT FROM t.fallback_replaces) = $3::boolean
  AND ($3::boolean
       OR NOT EXISTS (SELECT 1 FROM herald.attempts a
                      WHERE a.task_id = e.task_id AND a.attempt < t.lease_count
                        AND a.provider_message_id = e.provider_message_id))
GROUP BY e.task_id
