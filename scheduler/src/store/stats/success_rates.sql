-- Attempts whose outcome was recorded in [$2, $3), grouped by $5: 1 account, 2 template,
-- 3 hour (aligned in time zone $6, which matters for zones with a half-hour offset), 4 minute.
-- Outcome codes are the wire enum's: 1 OK, 2 RATE_LIMITED, 3 TRANSIENT, 4 PERMANENT,
-- 5 ACCOUNT_UNAVAILABLE, 6 LEASE_EXPIRED.
SELECT CASE $5::smallint
           WHEN 1 THEN coalesce(a.account, '')
           WHEN 2 THEN coalesce(t.template_id, '')
           ELSE '' END AS key,
       CASE $5::smallint
           WHEN 3 THEN date_trunc('hour', a.finished_at AT TIME ZONE $6::text)
                       AT TIME ZONE $6::text
           WHEN 4 THEN date_trunc('minute', a.finished_at) END AS bucket,
       count(*) AS attempts,
       count(*) FILTER (WHERE a.outcome = 1) AS ok,
       count(*) FILTER (WHERE a.outcome = 2) AS rate_limited,
       count(*) FILTER (WHERE a.outcome = 3) AS transient,
       count(*) FILTER (WHERE a.outcome = 4) AS permanent,
       count(*) FILTER (WHERE a.outcome = 5) AS account_unavailable,
       count(*) FILTER (WHERE a.outcome = 6) AS lease_expired
FROM herald.attempt_records a
-- Attempts carry no namespace or queue; their task does.
JOIN herald.task_records t ON t.id = a.task_id
WHERE a.finished_at >= $2 AND a.finished_at < $3
  AND t.namespace = $1
  AND ($4::text IS NULL OR t.queue = $4)
GROUP BY 1, 2
-- Time groupings come out in time order; key groupings (bucket NULL) busiest first.
ORDER BY bucket, attempts DESC, key
