-- Tasks by id within one namespace (missing ids are skipped).
SELECT {task_columns}
FROM herald.tasks t
WHERE t.id = ANY($1) AND t.namespace = $2
