-- A schedule's runs with a fire time before $3, newest first.
SELECT fire_time, kind, task_count, created_at, overran_at FROM herald.schedule_runs
WHERE namespace = $1 AND schedule_id = $2
  AND ($3::timestamptz IS NULL OR fire_time < $3)
ORDER BY fire_time DESC
LIMIT $4
