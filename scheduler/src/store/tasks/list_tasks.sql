-- One page of a namespace's tasks, newest first: those the selection's filter ($1-$11, see
-- TASK_FILTER in store/tasks/mod.rs) picks, after the page token's id $12.
SELECT {task_columns}
FROM herald.tasks t
WHERE {task_filter}
  AND ($11::uuid IS NULL OR t.id < $12)
ORDER BY t.id DESC
LIMIT $13
