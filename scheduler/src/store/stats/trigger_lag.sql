-- Trigger lag (lease grant minus due time, in milliseconds) of leases granted in [$2, $3):
-- one overall row (queue NULL) and one row per queue, via GROUPING SETS.
--
-- Attempts do not record their due time, but a task does: run_at is the due time of its latest
-- lease until a retry overwrites it. So each task's latest lease is measured (tasks.leased_at
-- against tasks.run_at) while that pair is still intact: the task is LEASED, has ended with a
-- report, or was cancelled while leased. Earlier attempts of a retried task are not measured.
WITH lags AS (
    SELECT t.queue,
           (extract(epoch FROM t.leased_at - t.run_at) * 1000)::double precision AS ms
    FROM herald.task_records t
    WHERE t.namespace = $1
      AND ($4::text IS NULL OR t.queue = $4)
      AND t.leased_at >= $2 AND t.leased_at < $3
      AND (t.state IN ('leased', 'succeeded', 'failed')
           -- Cancelled before any lease of this due time (NOT_STARTED): run_at and leased_at
           -- belong to different attempts.
           OR (t.state = 'cancelled' AND t.cancel_outcome IS DISTINCT FROM 1))
      -- A claim never grants before run_at, so a pair the other way round cannot be one
      -- lease; skipped rather than reported as a negative lag.
      AND t.leased_at >= t.run_at
)
SELECT queue,
       count(*) AS leases,
       coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), 0)::double precision AS p50_ms,
       coalesce(percentile_cont(0.9) WITHIN GROUP (ORDER BY ms), 0)::double precision AS p90_ms,
       coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms), 0)::double precision AS p99_ms,
       coalesce(max(ms), 0)::double precision AS max_ms,
       GROUPING(queue) = 1 AS overall
FROM lags
GROUP BY GROUPING SETS ((), (queue))
ORDER BY overall DESC, queue
