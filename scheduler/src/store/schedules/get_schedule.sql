-- One schedule.
SELECT {schedule_columns} FROM herald.schedules WHERE namespace = $1 AND id = $2
