-- Moves a fan-out past a written batch ($4: its last recipient, $5: tasks it created, $6: it
-- was the last), and counts the tasks on the run.
WITH advanced AS (
    UPDATE herald.fanouts
    SET after_recipient = $4, tasks_created = tasks_created + $5, done = $6, failures = 0,
        last_error = NULL
    WHERE namespace = $1 AND schedule_id = $2 AND fire_time = $3
    RETURNING namespace, schedule_id, fire_time
)
UPDATE herald.schedule_runs r SET task_count = r.task_count + $5
FROM advanced a
WHERE r.namespace = a.namespace AND r.schedule_id = a.schedule_id AND r.fire_time = a.fire_time
