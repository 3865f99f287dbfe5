-- Re-reads an active schedule under a lock for materialising: a pause, resume or delete since
-- the pass began wins. Also returns the database clock.
SELECT {schedule_columns}, herald.now() AS db_now FROM herald.schedules
WHERE namespace = $1 AND id = $2 AND NOT paused
FOR UPDATE
