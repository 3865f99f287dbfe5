-- The duplicate content guard, run in the transaction that inserted the guarded tasks $2 (with
-- their windows $3 in ms and content hashes $4), after their advisory keys were locked: a task
-- due within its window of another guarded task of the same namespace, recipient and content
-- that is not cancelled, failed or expired (earlier in the table, or earlier in this batch)
-- ends CANCELLED, nothing sent, with end reason `duplicate_content`; the others are recorded for the next ones. Returns the
-- tasks it ended.
WITH new AS (
    SELECT n.id, n.window_ms, n.hash, t.recipient, t.run_at
    FROM unnest($2::uuid[], $3::bigint[], $4::bytea[]) AS n(id, window_ms, hash)
    JOIN herald.tasks t ON t.id = n.id AND t.namespace = $1
),
dups AS (
    SELECT n.id FROM new n
    WHERE EXISTS (SELECT 1 FROM herald.content_guard g
                  JOIN herald.task_records o ON o.id = g.task_id
                  WHERE g.namespace = $1 AND g.recipient = n.recipient AND g.content_hash = n.hash
                    AND g.run_at > n.run_at - n.window_ms * interval '1 millisecond'
                    AND g.run_at < n.run_at + n.window_ms * interval '1 millisecond'
                    AND o.state IN ('scheduled', 'leased', 'succeeded'))
       OR EXISTS (SELECT 1 FROM new e
                  WHERE e.recipient = n.recipient AND e.hash = n.hash AND e.id < n.id
                    AND e.run_at > n.run_at - n.window_ms * interval '1 millisecond'
                    AND e.run_at < n.run_at + n.window_ms * interval '1 millisecond')
),
recorded AS (
    INSERT INTO herald.content_guard (task_id, namespace, recipient, content_hash, run_at)
    SELECT n.id, $1, n.recipient, n.hash, n.run_at FROM new n
    WHERE n.id NOT IN (SELECT id FROM dups)
    ON CONFLICT (task_id) DO NOTHING
)
UPDATE herald.tasks t
SET state = 'cancelled', end_reason = 'duplicate_content', cancel_outcome = 1,
    last_error = 'duplicate content', finished_at = herald.now(),
    updated_at = herald.now()
FROM dups d
WHERE t.id = d.id AND t.state = 'scheduled'
RETURNING t.id
