-- Deletes an account no live task needs, with what reports left waiting for it (a namesake
-- created later must not inherit released slots), and says why not otherwise. Run under the
-- account's lock (lock_account.sql), so a claim reserving on it has committed its leases. The
-- tasks that need it: those pinned to it (routed to it, parked behind a paused campaign or
-- not) and those leased through it; a pooled task waiting to be sent again only names the
-- account it last went through, and goes through another of its pool. The leased tasks are an arm of their own: tasks_account leaves them out
-- (migration 33), and the planner finds them through tasks_lease_expiry only for an arm that
-- says state = 'leased'.
WITH live AS (
    SELECT count(*) AS n FROM herald.tasks
    WHERE namespace = $1
      AND ((account_id = $2 AND state = 'scheduled'
            AND route IN ($1 || '/a:' || $2, 'paused:' || $1 || '/a:' || $2))
           OR (account_id = $2 AND state = 'leased'))
),
gone AS (
    DELETE FROM herald.accounts
    WHERE namespace = $1 AND id = $2 AND (SELECT n FROM live) = 0
    RETURNING id
),
deltas AS (
    DELETE FROM herald.account_deltas d
    USING gone WHERE d.namespace = $1 AND d.account_id = gone.id
)
SELECT (SELECT n FROM live) AS live,
       (SELECT count(*) FROM gone) AS gone,
       EXISTS (SELECT 1 FROM herald.accounts WHERE namespace = $1 AND id = $2) AS present
