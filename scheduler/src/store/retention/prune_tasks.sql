-- Deletes up to $3 tasks that ended more than $1 ms ago and are still in herald.tasks (the
-- retention job moves the others into the history, whose partitions it drops instead: these
-- are a campaign's that ran longer than the retention, or ones the job fell behind on), with
-- their attempts, delivery reports and duplicate content guard rows; their idempotency keys
-- start their own retention ($2 ms) from the task's end.
-- The walk of tasks_finished starts at $4 (the job's low-water mark, src/low_water.rs; NULL:
-- the oldest entry), past the entries of the tasks earlier batches deleted. Returns the latest
-- end time deleted, where the next batch can start.
WITH old AS (
    SELECT id, finished_at FROM herald.tasks
    WHERE finished_at < herald.now() - $1::bigint * interval '1 millisecond'
      AND finished_at >= coalesce($4::timestamptz, '-infinity')
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
guards AS (
    DELETE FROM herald.content_guard g USING gone WHERE g.task_id = gone.id
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
SELECT count(*)::bigint AS pruned, max(finished_at) AS pruned_through FROM gone
