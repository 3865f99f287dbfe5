-- Replaces a schedule's definition (merged and checked by the caller) and its cursor $14.
UPDATE herald.schedules
SET cron = $3, time_zone = $4, skipped_time = $5, repeated_time = $6, overlap = $7,
    misfire = $8, misfire_grace_ms = $9, jitter_ms = $10, stagger_ms = $11,
    stagger_off_round = $12, spec = $13, next_fire_at = $14, updated_at = herald.now()
WHERE namespace = $1 AND id = $2
RETURNING {schedule_columns}
