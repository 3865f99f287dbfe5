-- Deletes an account no live task needs, with what reports left waiting for it (a namesake
-- created later must not inherit released slots), and says why not otherwise. The leased tasks
-- are an arm of their own: tasks_account leaves them out (migration 33), and the planner finds
-- them through tasks_lease_expiry only for an arm that says state = 'leased'.
WITH live AS (
    SELECT count(*) AS n FROM herald.tasks
    WHERE namespace = $1
      AND ((account_id = $2 AND state = 'scheduled') OR (account_id = $2 AND state = 'leased'))
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
