-- Cancels a task that has not ended. The CTE reads the state before the update, so the caller
-- learns whether an executor held it. A leased task's late report cannot revive it: reports
-- only move LEASED tasks (see complete_attempts.sql).
WITH before AS (
    SELECT id, state, lease_count, executor_id, account_id
    FROM herald.tasks
    WHERE id = $1 AND namespace = $2
    FOR UPDATE
),
updated AS (
    UPDATE herald.tasks t
    SET state = 'cancelled',
        end_reason = 'cancelled',
        cancel_outcome = CASE WHEN b.state = 'leased' THEN 5 ELSE 1 END,
        finished_at = herald.now(),
        updated_at = herald.now()
    FROM before b
    WHERE t.id = b.id AND b.state IN ('scheduled', 'leased')
    RETURNING t.id
)
SELECT b.state::text AS state, b.lease_count AS attempt, b.executor_id,
       EXISTS (SELECT 1 FROM updated) AS changed, b.account_id
FROM before b
