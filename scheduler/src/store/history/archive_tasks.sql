-- Moves up to $4 tasks that ended more than $1 ms ago (but not more than the task retention,
-- $2 ms: those are pruned instead) from herald.tasks into the history, with their attempts, in
-- one statement. A task cancelled while leased stays until its executor reports (its lease's
-- expiry is cleared then): the report, which tells whether the message went, applies to the
-- hot table only, and moved first it was dropped (and an attempt row it wrote during the move
-- was left behind in herald.attempts). A campaign's tasks stay while it can still get recipients: its unique
-- (campaign_id, recipient) index is what keeps a resumed campaign from messaging anyone twice.
-- The task's idempotency key is kept for the longer of the key retention ($3 ms) and as long as
-- the task itself may still be read: its partition (at most $6 ms wide, from the task's end)
-- is dropped once all of it is past the task retention. Forgotten at the task retention alone,
-- the key went up to a partition's width before its task, and a create with that key made and
-- sent a second task while the first was still listed. The walk of tasks_finished starts at $5 (the job's low-water mark,
-- src/low_water.rs; NULL: the oldest entry). Returns how many moved and the latest end time
-- moved, where the next batch can start.
-- The rows are not locked before they are deleted (a second write of each): a retry or a late
-- failure changing one meanwhile makes the DELETE re-check its own conditions on the new
-- version, and a task that is live again no longer matches. One replica moves at a time (a
-- transaction-scoped advisory lock; the others move nothing this pass), so two never wait on
-- each other's rows; a bulk batch being chosen holds the same lock shared (hold_moves.sql),
-- and the move waits for a later pass.
WITH gate AS (
    SELECT pg_try_advisory_xact_lock(7526744137461661954) AS mine
),
picked AS (
    SELECT t.id
    FROM herald.tasks t
    WHERE (SELECT mine FROM gate)
      AND t.finished_at < herald.now() - $1::bigint * interval '1 millisecond'
      AND t.finished_at >= greatest(coalesce($5::timestamptz, '-infinity'),
                                    herald.now() - $2::bigint * interval '1 millisecond')
      AND t.lease_expires_at IS NULL
      AND (t.campaign_id IS NULL
           OR EXISTS (SELECT 1 FROM herald.campaigns c
                      WHERE c.id = t.campaign_id AND c.state IN ('finished', 'cancelled')))
    ORDER BY t.finished_at
    LIMIT $4::bigint
),
moved AS (
    DELETE FROM herald.tasks t
    WHERE t.id IN (SELECT id FROM picked)
      AND t.finished_at < herald.now() - $1::bigint * interval '1 millisecond'
      AND t.state IN ('succeeded', 'failed', 'cancelled', 'expired')
      AND t.lease_expires_at IS NULL
    RETURNING t.*
),
tasks_out AS (
    INSERT INTO herald.task_history SELECT * FROM moved
),
attempts_moved AS (
    DELETE FROM herald.attempts a USING moved m WHERE a.task_id = m.id
    RETURNING jsonb_populate_record(a, jsonb_build_object('task_finished_at', m.finished_at)) AS r
),
attempts_out AS (
    INSERT INTO herald.attempt_history SELECT (r).* FROM attempts_moved
),
keys AS (
    UPDATE herald.idempotency_keys k
    SET forget_after = m.finished_at
                       + greatest($2::bigint + $6::bigint, $3::bigint) * interval '1 millisecond'
    FROM moved m
    WHERE m.idempotency_key IS NOT NULL
      AND k.namespace = m.namespace AND k.key = m.idempotency_key AND k.task_id = m.id
)
SELECT count(*)::bigint AS archived, max(finished_at) AS archived_through FROM moved
