-- The next failed tasks of a campaign whose last attempt ended as $2 saying $3 (NULL outcome:
-- the task failed without an attempt), after id $4: what "retry all failed of this reason"
-- re-drives, a page at a time.
SELECT t.id
FROM herald.tasks t
LEFT JOIN LATERAL (
    SELECT outcome, error FROM herald.attempts
    WHERE task_id = t.id
    ORDER BY attempt DESC
    LIMIT 1
) a ON true
WHERE t.campaign_id = $1 AND t.state = 'failed'
  AND a.outcome IS NOT DISTINCT FROM $2
  AND coalesce(a.error, t.last_error, '') = $3
  AND ($4::uuid IS NULL OR t.id > $4)
ORDER BY t.id
LIMIT $5
