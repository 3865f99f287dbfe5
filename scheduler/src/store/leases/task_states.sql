-- The current states of tasks of the namespace: what a refused report is answered with. Another
-- namespace's task is not found here, exactly like a task that does not exist.
SELECT id, state::text AS state
FROM herald.task_records
WHERE id = ANY($1) AND namespace = $2
