-- Live tasks (scheduled, leased) by state and queue, for the herald_tasks gauge: counted by
-- herald.live_task_counts (store/tasks/functions.sql), which runs without parallel workers.
SELECT state, queue, tasks, due FROM herald.live_task_counts()
