-- Indexes for StatsService and the dashboard, which read by time windows.
-- Success rates, send durations and the per-minute chart read attempts by when their outcome
-- was recorded.
CREATE INDEX attempts_finished ON herald.attempts (finished_at);
-- CountTasks finds pending tasks by due time; tasks_due leads with the route, so it cannot.
CREATE INDEX tasks_pending_run_at ON herald.tasks (run_at)
    WHERE state IN ('scheduled', 'leased');
