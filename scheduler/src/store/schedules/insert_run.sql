-- Records a run; nothing when that fire time already has one (materialising is idempotent on
-- (schedule, fire time)). Kinds: 'fired', 'catch_up', 'manual',
-- 'skipped_overlap', 'skipped_expired'.
-- $6: when to check whether the run overran (fire time + the spec's overrun_after; NULL: never).
-- $7: why recipients were left out of the run; NULL when none was.
INSERT INTO herald.schedule_runs (namespace, schedule_id, fire_time, kind, task_count,
                                  overrun_deadline, error)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT DO NOTHING
