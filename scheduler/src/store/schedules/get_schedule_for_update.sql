-- One schedule, locked for the rest of the transaction (UpdateSchedule). The materialiser
-- locks the same row (lock_schedule.sql), so a change lands wholly before or after a run.
SELECT {schedule_columns} FROM herald.schedules WHERE namespace = $1 AND id = $2
FOR UPDATE
