-- The next batch of an operation: tasks its filter selects ($1-$11, TASK_FILTER), created by
-- the time it started ($14), after its cursor ($12), in id order, at most $13. Locked (waiting
-- for a claim or report holding one, never skipping it, or the cursor would pass it by); a
-- row that no longer matches once its lock is free is left out.
SELECT t.id
FROM herald.tasks t
WHERE {task_filter}
  AND ($11::uuid IS NULL OR t.id > $12)
  AND t.created_at <= $14
ORDER BY t.id
LIMIT $13
FOR UPDATE OF t
