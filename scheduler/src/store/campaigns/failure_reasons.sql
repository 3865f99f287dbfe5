-- A campaign's failed tasks grouped by how their last attempt ended and what it said (the
-- provider's code is part of the error text). The tasks come from tasks_campaign
-- (campaign_id, state, ...), each one's last attempt from the attempts primary key.
SELECT a.outcome, coalesce(a.error, t.last_error, '') AS error, count(*) AS tasks
FROM herald.tasks t
LEFT JOIN LATERAL (
    SELECT outcome, error FROM herald.attempts
    WHERE task_id = t.id
    ORDER BY attempt DESC
    LIMIT 1
) a ON true
WHERE t.campaign_id = $1 AND t.state = 'failed'
GROUP BY 1, 2
ORDER BY tasks DESC, error
LIMIT $2
