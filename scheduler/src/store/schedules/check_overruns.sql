-- Checks the runs whose overrun deadline passed, at most 500 at a time: a run with a task
-- still SCHEDULED or LEASED is marked overran (the caller raises `schedule.run_overran` in
-- this transaction), the rest finished in time. Either way the deadline is cleared, so each run
-- is checked once. Safe on every replica at once: rows are taken with SKIP LOCKED.
WITH due AS (
    SELECT r.namespace, r.schedule_id, r.fire_time, r.overrun_deadline
    FROM herald.schedule_runs r
    WHERE r.overrun_deadline <= herald.now()
    ORDER BY r.overrun_deadline
    LIMIT 500
    FOR UPDATE SKIP LOCKED
),
checked AS (
    SELECT d.*,
           (SELECT count(*) FROM herald.tasks t
            WHERE t.schedule_id = d.schedule_id AND t.namespace = d.namespace
              AND t.fire_time = d.fire_time AND t.state IN ('scheduled', 'leased')) AS live_tasks
    FROM due d
),
marked AS (
    UPDATE herald.schedule_runs r
    SET overrun_deadline = NULL,
        overran_at = CASE WHEN c.live_tasks > 0 THEN herald.now() END
    FROM checked c
    WHERE r.namespace = c.namespace AND r.schedule_id = c.schedule_id
      AND r.fire_time = c.fire_time
    RETURNING r.namespace, r.schedule_id, r.fire_time, c.overrun_deadline, c.live_tasks,
              r.overran_at
)
SELECT namespace, schedule_id, fire_time, live_tasks,
       (extract(epoch FROM overrun_deadline - fire_time) * 1000)::bigint AS overrun_after_ms
FROM marked
WHERE overran_at IS NOT NULL
