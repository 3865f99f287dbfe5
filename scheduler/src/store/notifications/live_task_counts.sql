-- Live tasks (scheduled, leased) by state and queue, for the herald_tasks gauge. Only the two
-- live states: the partial indexes on them keep finished tasks, the bulk of the table, out of
-- the scan.
SELECT state::text AS state, queue, count(*) AS tasks FROM herald.tasks
WHERE state IN ('scheduled', 'leased')
GROUP BY 1, 2
