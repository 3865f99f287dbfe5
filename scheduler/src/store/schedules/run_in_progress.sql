-- Whether an earlier run of the schedule still has live tasks (overlap policy SKIP).
SELECT EXISTS (SELECT 1 FROM herald.tasks
               WHERE schedule_id = $1 AND namespace = $2
                 AND state IN ('scheduled', 'leased')) AS busy
