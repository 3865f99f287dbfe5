-- The next batch of an operation: tasks its filter selects (TASK_FILTER), created by the time
-- it started ({$+3}), after its cursor ({$+1}), in id order, at most {$+2}. Those in the hot
-- table are locked (waiting for a claim or report holding one, never skipping it, or the
-- cursor would pass it by); a row that no longer matches once its lock is free is left out.
-- Those in the history have ended and change only by the operation's own statements (a retry
-- brings its task back first), so they are read without a lock.
WITH hot AS (
    SELECT t.id
    FROM herald.tasks t
    WHERE {task_filter}
      AND ({$+1}::uuid IS NULL OR t.id > {$+1})
      AND t.created_at <= {$+3}
    ORDER BY t.id
    LIMIT {$+2}
    FOR UPDATE OF t
),
moved AS (
    SELECT t.id
    FROM herald.task_history t
    WHERE {task_filter}
      AND ({$+1}::uuid IS NULL OR t.id > {$+1})
      AND t.created_at <= {$+3}
    ORDER BY t.id
    LIMIT {$+2}
)
SELECT id FROM (SELECT id FROM hot UNION ALL SELECT id FROM moved) batch
ORDER BY id
LIMIT {$+2}
