-- Milliseconds until the earliest overrun deadline still to check, by herald's clock.
SELECT (extract(epoch FROM min(overrun_deadline) - herald.now()) * 1000)::float8 AS wait_ms
FROM herald.schedule_runs WHERE overrun_deadline IS NOT NULL
