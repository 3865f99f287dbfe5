-- Milliseconds until the earliest cursor of an active schedule, by the database clock.
SELECT (extract(epoch FROM min(next_fire_at) - herald.now()) * 1000)::float8 AS wait_ms
FROM herald.schedules WHERE NOT paused
