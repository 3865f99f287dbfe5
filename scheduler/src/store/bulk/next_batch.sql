-- The next batch of an operation: tasks its filter selects ($1-$13, TASK_FILTER), created by
-- the time it started ($16), after its cursor ($14), in id order, at most $15. Locked (waiting
-- for a claim or report holding one, never skipping it, or the cursor would pass it by); a
-- row that no longer matches once its lock is free is left out.
SELECT t.id
FROM herald.tasks t
WHERE {task_filter}
  AND ($14::uuid IS NULL OR t.id > $14)
  AND t.created_at <= $16
ORDER BY t.id
LIMIT $15
FOR UPDATE OF t
