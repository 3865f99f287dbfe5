-- A schedule's runs with a fire time before $3, newest first, with their fan-out's state.
SELECT r.fire_time, r.kind, r.task_count, r.created_at, r.overran_at,
       COALESCE(NOT f.done, false) AS fanning_out, f.last_error AS fanout_error
FROM herald.schedule_runs r
LEFT JOIN herald.fanouts f USING (namespace, schedule_id, fire_time)
WHERE r.namespace = $1 AND r.schedule_id = $2
  AND ($3::timestamptz IS NULL OR r.fire_time < $3)
ORDER BY r.fire_time DESC
LIMIT $4
