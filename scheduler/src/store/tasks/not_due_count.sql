-- How many of the namespace's scheduled tasks are not due yet, counting at most $2 (a walk of
-- tasks_pending_run_at from now on).
SELECT count(*) AS tasks
FROM (
    SELECT 1
    FROM herald.tasks
    WHERE namespace = $1 AND state = 'scheduled' AND run_at > herald.now()
    LIMIT $2
) later
