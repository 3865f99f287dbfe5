-- The namespace's due, unclaimed tasks grouped by what decides whether they can go (queue, pool,
-- pinned account, parked by a paused campaign), from the oldest due: the front page's "why is
-- it waiting". The inner walk of tasks_pending_run_at (namespace, run_at) stops after $2 rows,
-- so a backlog of millions costs the same as one of $2.
SELECT queue, pool, account_id, parked, count(*) AS tasks, min(run_at) AS oldest
FROM (
    -- A pooled task keeps the account of its last attempt in account_id, but the pool routes
    -- it (any of its accounts may send it next): grouped by the pool alone, as the task's own
    -- page explains it. Only a task pinned to an account (no pool) is held by that account.
    SELECT queue, pool, CASE WHEN pool IS NULL THEN account_id END AS account_id,
           route LIKE 'paused:%' AS parked, run_at
    FROM herald.tasks
    WHERE namespace = $1 AND state = 'scheduled' AND run_at <= herald.now()
    ORDER BY run_at
    LIMIT $2
) due
GROUP BY queue, pool, account_id, parked
ORDER BY tasks DESC
