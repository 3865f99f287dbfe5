-- Tasks by id within one namespace (missing ids are skipped).
SELECT {task_columns}
FROM herald.task_records t
WHERE t.id = ANY($1) AND t.namespace = $2
