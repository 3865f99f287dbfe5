-- How far campaign $1's accepted messages got: each task's reports (delivery_events_task),
-- folded to accepted, delivered (or read), read and failed after acceptance; of a task whose
-- message a window-closed fallback replaced (migration 25), the fallback's message.
SELECT count(*) FILTER (WHERE r.accepted) AS accepted,
       count(*) FILTER (WHERE r.delivered OR r.read) AS delivered,
       count(*) FILTER (WHERE r.read) AS read,
       count(*) FILTER (WHERE r.failed) AS failed
FROM herald.tasks t
CROSS JOIN LATERAL (
    SELECT bool_or(d.state = 1) AS accepted, bool_or(d.state = 2) AS delivered,
           bool_or(d.state = 3) AS read, bool_or(d.state = 4) AS failed
    FROM herald.delivery_events d
    WHERE d.task_id = t.id
      AND d.provider_message_id IS DISTINCT FROM t.fallback_replaces
) r
WHERE t.campaign_id = $1
