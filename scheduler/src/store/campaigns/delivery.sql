-- How far campaign $1's accepted messages got: each task's reports (delivery_events_task),
-- folded to accepted, delivered (or read), read and failed after acceptance; only those on
-- each task's current message (herald.task_reports).
SELECT count(*) FILTER (WHERE r.accepted) AS accepted,
       count(*) FILTER (WHERE r.delivered OR r.read) AS delivered,
       count(*) FILTER (WHERE r.read) AS read,
       count(*) FILTER (WHERE r.failed) AS failed
FROM herald.task_records t
CROSS JOIN LATERAL (
    SELECT bool_or(d.state = 1) AS accepted, bool_or(d.state = 2) AS delivered,
           bool_or(d.state = 3) AS read, bool_or(d.state = 4) AS failed
    FROM herald.task_reports(t.id, t.lease_count, t.fallback_replaces) d
) r
WHERE t.campaign_id = $1
