-- Counts tasks by state in the window [$2, $3). A task is placed in time by one instant: when
-- it ended (finished_at) if it has, else when it is due (run_at). The two arms are disjoint
-- (only ended tasks have finished_at) and each walks indexes: tasks_finished with
-- task_history_finished, and for live tasks, all in herald.tasks, tasks_pending_run_at
-- (namespace, run_at; scheduled ones) or-ed with tasks_lease_expiry (leased ones, as few as
-- the executors' credit). The states are or-ed, not listed: the planner combines partial
-- indexes for the arms of an OR, not for the values of an `IN (...)` (migration 31).
-- Ended tasks are also split by why they ended (end_reason; NULL for pending ones).
SELECT state, end_reason, count(*) AS tasks
FROM (
    SELECT state::text AS state, end_reason::text AS end_reason
    FROM herald.task_records
    WHERE namespace = $1
      AND finished_at >= $2 AND finished_at < $3
      AND ($4::text IS NULL OR queue = $4)
    UNION ALL
    SELECT state::text, NULL
    FROM herald.tasks
    WHERE namespace = $1
      AND (state = 'scheduled' OR state = 'leased')
      AND run_at >= $2 AND run_at < $3
      AND ($4::text IS NULL OR queue = $4)
) placed
GROUP BY state, end_reason
