-- tasks_pending_run_at (migration 9) took an entry from every leased version of a task as well
-- as every scheduled one. A lease is never a HOT update, so each lease wrote one index entry
-- more than it needed. The two readers that want leased tasks with scheduled ones (CountTasks,
-- the live-task gauge) find the leased ones through tasks_lease_expiry instead, or-ed with this
-- index: it holds only leased tasks, as few as the executors' credit. Without those entries the
-- drain took about 7 % less database CPU a task (S1 in docs/performance.md). Like every
-- migration this runs in one transaction, so the new index is built while writes wait: it holds
-- only the scheduled tasks.
DROP INDEX herald.tasks_pending_run_at;
CREATE INDEX tasks_pending_run_at ON herald.tasks (namespace, run_at)
    WHERE state = 'scheduled';
