-- Ends scheduled tasks whose deadline passed before they could be leased.
WITH overdue AS (
    SELECT id
    FROM herald.tasks
    WHERE state = 'scheduled' AND expire_at IS NOT NULL AND expire_at <= herald.now()
    ORDER BY expire_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE herald.tasks t
SET state = 'expired',
    end_reason = 'expired',
    finished_at = herald.now(),
    updated_at = herald.now(),
    last_error = COALESCE(t.last_error, 'deadline passed before the task could be sent')
FROM overdue o
WHERE t.id = o.id
