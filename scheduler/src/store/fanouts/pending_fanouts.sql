-- Unfinished fan-outs due for their next batch, oldest first.
SELECT namespace, schedule_id, fire_time, catch_up, period_start, period_end, after_recipient,
       failures, spec
FROM herald.fanouts
WHERE NOT done AND next_try_at <= herald.now()
ORDER BY next_try_at
LIMIT $1
