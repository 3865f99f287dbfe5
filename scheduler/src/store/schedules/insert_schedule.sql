-- Inserts a schedule; nothing when the id is taken. $14 is its first fire time.
INSERT INTO herald.schedules (namespace, id, cron, time_zone, skipped_time, repeated_time,
                              overlap, misfire, misfire_grace_ms, jitter_ms, stagger_ms,
                              stagger_off_round, spec, next_fire_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
ON CONFLICT DO NOTHING
RETURNING {schedule_columns}
