-- Milliseconds until the earliest unfinished fan-out is due, by the database clock.
SELECT (extract(epoch FROM min(next_try_at) - herald.now()) * 1000)::float8 AS wait_ms
FROM herald.fanouts WHERE NOT done
