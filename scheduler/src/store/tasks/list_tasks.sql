-- One page of a namespace's tasks, newest first: those the selection's filter (TASK_FILTER in
-- store/tasks/mod.rs) picks, after the page token's id {$+1}, at most {$+2}.
SELECT {task_columns}
FROM herald.task_records t
WHERE {task_filter}
  AND ({$+1}::uuid IS NULL OR t.id < {$+1})
ORDER BY t.id DESC
LIMIT {$+2}
