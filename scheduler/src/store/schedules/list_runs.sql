-- A schedule's runs with a fire time before $3, newest first, with their fan-out's state and
-- why recipients were left out (the fan-out's last failure, else the run's own).
SELECT r.fire_time, r.kind, r.task_count, r.created_at, r.overran_at,
       COALESCE(NOT f.done, false) AS fanning_out, COALESCE(f.last_error, r.error) AS error
FROM herald.schedule_runs r
LEFT JOIN herald.fanouts f USING (namespace, schedule_id, fire_time)
WHERE r.namespace = $1 AND r.schedule_id = $2
  AND ($3::timestamptz IS NULL OR r.fire_time < $3)
ORDER BY r.fire_time DESC
LIMIT $4
