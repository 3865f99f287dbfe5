-- Re-drives a FAILED task with a fresh attempt budget; lease_count keeps growing so the fencing
-- tokens of earlier attempts stay stale.
UPDATE herald.tasks
SET state = 'scheduled',
    attempts = 0,
    run_at = COALESCE($3, herald.now()),
    finished_at = NULL,
    end_reason = NULL,
    end_code = NULL,
    updated_at = herald.now()
WHERE id = $1 AND namespace = $2 AND state = 'failed'
RETURNING id
