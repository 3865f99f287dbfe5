-- Live tasks (scheduled, leased) by state and queue, for the herald_tasks gauge. Only the two
-- live states, each through the partial index holding only it (tasks_pending_run_at,
-- tasks_lease_expiry): finished tasks, the bulk of the table, stay out of the scan. Or-ed, not
-- listed: the planner combines partial indexes for the arms of an OR, not for the values of an
-- `IN (...)` (migration 31).
SELECT state::text AS state, queue, count(*) AS tasks FROM herald.tasks
WHERE state = 'scheduled' OR state = 'leased'
GROUP BY 1, 2
