-- Whether an earlier run of the schedule is still going (overlap policy SKIP): it has live
-- tasks, or recipients still to become tasks (an audience or variables-source fan-out, which
-- may be waiting to ask a failed source again).
SELECT EXISTS (SELECT 1 FROM herald.tasks
               WHERE schedule_id = $1 AND namespace = $2
                 AND state IN ('scheduled', 'leased'))
       OR EXISTS (SELECT 1 FROM herald.fanouts
                  WHERE schedule_id = $1 AND namespace = $2 AND NOT done) AS busy
