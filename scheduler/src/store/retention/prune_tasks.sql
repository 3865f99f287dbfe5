-- Deletes up to $3 tasks that ended more than $1 ms ago, with their attempts and delivery
-- reports; their idempotency keys start their own retention ($2 ms) from the task's end.
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
deliveries AS (
    DELETE FROM herald.delivery_events e USING gone WHERE e.task_id = gone.id
),
-- Delivery reports no task ever claimed (another installation's messages, or sends whose
-- report never came) go after the task retention too.
unclaimed AS (
    DELETE FROM herald.delivery_events e
    WHERE e.task_id IS NULL
      AND e.recorded_at < herald.now() - $1::bigint * interval '1 millisecond'
),
keys AS (
    UPDATE herald.idempotency_keys k
    SET forget_after = gone.finished_at + $2::bigint * interval '1 millisecond'
    FROM gone WHERE k.task_id = gone.id
)
SELECT count(*)::bigint AS pruned FROM gone
