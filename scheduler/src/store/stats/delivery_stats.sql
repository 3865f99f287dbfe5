-- How far the messages of namespace $1 accepted in [$2, $3) got, optionally of queue $4: counts
-- by furthest report and accepted → delivered percentiles in milliseconds. A task counts as its
-- current message got (herald.task_reports): not the one its window-closed fallback replaced,
-- nor one an earlier attempt sent. It is placed, and its delivery timed, by that message's
-- acceptance: a task retried ten minutes after its first message failed is not ten minutes
-- slow to deliver. Tasks are found by any acceptance in the window (delivery_events_accepted),
-- so a current message accepted in the window is never missed; its later reports are found by
-- task (delivery_events_task).
WITH accepted AS (
    SELECT DISTINCT e.task_id
    FROM herald.delivery_events e
    WHERE e.namespace = $1 AND e.state = 1 AND e.task_id IS NOT NULL
      AND e.occurred_at >= $2 AND e.occurred_at < $3
),
folded AS (
    SELECT r.accepted_at, r.delivered_at, r.read, r.failed
    FROM accepted a
    JOIN herald.task_records t ON t.id = a.task_id
    CROSS JOIN LATERAL (
        SELECT min(d.occurred_at) FILTER (WHERE d.state = 1) AS accepted_at,
               min(d.occurred_at) FILTER (WHERE d.state = 2) AS delivered_at,
               bool_or(d.state = 3) AS read,
               bool_or(d.state = 4) AS failed
        FROM herald.task_reports(t.id, t.lease_count, t.fallback_replaces) d
    ) r
    WHERE ($4::text IS NULL OR t.queue = $4)
      AND r.accepted_at >= $2 AND r.accepted_at < $3
)
SELECT count(*) AS accepted,
       count(*) FILTER (WHERE delivered_at IS NOT NULL OR read) AS delivered,
       count(*) FILTER (WHERE read) AS read,
       count(*) FILTER (WHERE failed) AS failed,
       count(*) FILTER (WHERE delivered_at IS NOT NULL) AS measured,
       percentile_disc(ARRAY[0.5, 0.95, 0.99]::float8[]) WITHIN GROUP (
           ORDER BY greatest(extract(epoch FROM delivered_at - accepted_at) * 1000, 0)::bigint)
           FILTER (WHERE delivered_at IS NOT NULL) AS latency_ms
FROM folded
