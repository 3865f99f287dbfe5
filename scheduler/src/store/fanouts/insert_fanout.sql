-- Records that a run's recipients are still to become tasks, in the transaction that inserts
-- the run, with the schedule's spec as it is now ($7); nothing when that run has one already.
INSERT INTO herald.fanouts (namespace, schedule_id, fire_time, catch_up, period_start,
                            period_end, next_try_at, spec)
VALUES ($1, $2, $3, $4, $5, $6, herald.now(), $7)
ON CONFLICT DO NOTHING
