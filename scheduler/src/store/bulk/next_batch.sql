-- The next batch of an operation: tasks its filter selects (TASK_FILTER), created by the time
-- it started ({$+3}), after its cursor ({$+1}), in id order, at most {$+2}. Locked (waiting for
-- a claim or report holding one, never skipping it, or the cursor would pass it by); a row
-- that no longer matches once its lock is free is left out.
SELECT t.id
FROM herald.tasks t
WHERE {task_filter}
  AND ({$+1}::uuid IS NULL OR t.id > {$+1})
  AND t.created_at <= {$+3}
ORDER BY t.id
LIMIT {$+2}
FOR UPDATE OF t
