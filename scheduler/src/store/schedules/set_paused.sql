-- Pauses or resumes a schedule. Resuming a paused one sets the cursor to $4 (the first fire
-- time after now), so fire times passed while paused are not treated as missed; resuming an
-- active schedule keeps its cursor.
UPDATE herald.schedules
SET paused = $3,
    next_fire_at = CASE WHEN paused AND NOT $3 THEN $4 ELSE next_fire_at END,
    updated_at = herald.now()
WHERE namespace = $1 AND id = $2
RETURNING {schedule_columns}
