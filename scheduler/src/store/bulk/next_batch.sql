-- The next batch of an operation: tasks its filter selects ($1-$10, TASK_FILTER), created by
-- the time it started ($13), after its cursor ($11), in id order, at most $12. Locked (waiting
-- for a claim or report holding one, never skipping it, or the cursor would pass it by); a
-- row that no longer matches once its lock is free is left out.
SELECT t.id
FROM herald.tasks t
WHERE {task_filter}
  AND ($11::uuid IS NULL OR t.id > $11)
  AND t.created_at <= $13
ORDER BY t.id
LIMIT $12
FOR UPDATE OF t
