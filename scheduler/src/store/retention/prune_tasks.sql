-- Deletes up to $3 tasks that ended more than $1 ms ago, with their attempts; their idempotency
-- keys start their own retention ($2 ms) from the task's end.
WITH old AS (
    SELECT id, finished_at FROM herald.tasks
    WHERE finished_at < herald.now() - $1::bigint * interval '1 millisecond'
    ORDER BY finished_at
    LIMIT $3::bigint
    FOR UPDATE SKIP LOCKED
),
gone AS (
    DELETE FROM herald.tasks t USING old WHERE t.id = old.id
    RETURNING t.id, old.finished_at
),
attempts AS (
    DELETE FROM herald.attempts a USING gone WHERE a.task_id = gone.id
),
keys AS (
    UPDATE herald.idempotency_keys k
    SET forget_after = gone.finished_at + $2::bigint * interval '1 millisecond'
    FROM gone WHERE k.task_id = gone.id
)
SELECT count(*)::bigint AS pruned FROM gone
