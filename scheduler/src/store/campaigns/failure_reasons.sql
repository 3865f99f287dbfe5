-- A campaign's failed tasks grouped by why they ended and the provider's code (migration
-- V15), largest first, each group with one of its errors as an example. The tasks come from
-- tasks_campaign (campaign_id, state, ...): bounded by the campaign's size.
SELECT t.end_reason::text AS end_reason, coalesce(t.end_code, 0) AS end_code,
       min(coalesce(t.last_error, '')) AS example, count(*) AS tasks
FROM herald.task_records t
WHERE t.campaign_id = $1 AND t.state = 'failed'
GROUP BY 1, 2
ORDER BY tasks DESC, end_reason, end_code
LIMIT $2
