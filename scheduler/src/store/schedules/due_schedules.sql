-- Active schedules whose cursor is due within the look-ahead ($1 ms), earliest first.
SELECT {schedule_columns}, namespace FROM herald.schedules
WHERE NOT paused AND next_fire_at <= herald.now() + $1::bigint * interval '1 millisecond'
ORDER BY next_fire_at
