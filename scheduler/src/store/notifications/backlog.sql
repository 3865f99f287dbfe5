-- Notifications waiting, and milliseconds until the earliest is due.
SELECT count(*) AS waiting,
       (EXTRACT(EPOCH FROM (min(next_attempt_at) - now())) * 1000)::float8 AS next_due_ms
FROM herald.notifications
