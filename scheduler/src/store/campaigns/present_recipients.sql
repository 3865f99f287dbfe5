-- Which of the recipients $2 the campaign already has, among its live tasks and those that
-- ended and moved into the history (else a recipient sent long ago would be added again).
SELECT recipient FROM herald.tasks WHERE campaign_id = $1 AND recipient = ANY($2)
UNION ALL
SELECT h.recipient FROM herald.task_history h
WHERE h.namespace = (SELECT c.namespace FROM herald.campaigns c WHERE c.id = $1)
  AND h.recipient = ANY($2) AND h.campaign_id = $1
