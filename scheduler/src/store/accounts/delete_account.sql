-- Deletes an account no live task needs, with what reports left waiting for it (a namesake
-- created later must not inherit released slots), and says why not otherwise.
WITH live AS (
    SELECT count(*) AS n FROM herald.tasks
    WHERE account_id = $2 AND namespace = $1 AND state IN ('scheduled', 'leased')
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
