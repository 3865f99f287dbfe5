-- Schedules with an id after $2, by id.
SELECT {schedule_columns} FROM herald.schedules
WHERE namespace = $1 AND id > $2
ORDER BY id
LIMIT $3
