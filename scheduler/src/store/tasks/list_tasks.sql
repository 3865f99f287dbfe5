-- One page of a namespace's tasks, newest first: those the selection's filter ($1-$13, see
-- TASK_FILTER in store/tasks/mod.rs) picks, after the page token's id $14.
SELECT {task_columns}
FROM herald.tasks t
WHERE {task_filter}
  AND ($14::uuid IS NULL OR t.id < $14)
ORDER BY t.id DESC
LIMIT $15
