-- Records a run; nothing when that fire time already has one (materialising is idempotent on
-- (schedule, fire time)). Kinds: 'fired', 'catch_up', 'skipped_overlap'.
INSERT INTO herald.schedule_runs (namespace, schedule_id, fire_time, kind, task_count)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT DO NOTHING
