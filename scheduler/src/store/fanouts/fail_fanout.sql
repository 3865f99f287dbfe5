-- Records a failed batch: tried again after $4 ms, or given up ($6) with the error kept.
UPDATE herald.fanouts
SET failures = failures + 1, last_error = $5, done = $6,
    next_try_at = herald.now() + $4::bigint * interval '1 millisecond'
WHERE namespace = $1 AND schedule_id = $2 AND fire_time = $3 AND NOT done
