-- Brings the tasks among $1 that are in the history back into herald.tasks (see
-- herald.restore_tasks).
SELECT herald.restore_tasks($1::uuid[]) AS id
