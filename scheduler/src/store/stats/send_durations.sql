-- Send duration per queue and template of attempts recorded in [$2, $3): from the executor
-- starting the send (started_at, the executor's clock) to the outcome being recorded
-- (finished_at, the database's clock). Clamped at zero, since the two clocks may disagree by
-- a little. Attempts without started_at (lease expiries) sent nothing measurable.
SELECT t.queue,
       coalesce(t.template_id, '') AS template_id,
       count(*) AS attempts,
       avg(greatest(extract(epoch FROM a.finished_at - a.started_at), 0) * 1000)
           ::double precision AS avg_ms,
       max(greatest(extract(epoch FROM a.finished_at - a.started_at), 0) * 1000)
           ::double precision AS max_ms
FROM herald.attempt_records a
JOIN herald.task_records t ON t.id = a.task_id
WHERE a.finished_at >= $2 AND a.finished_at < $3
  AND a.started_at IS NOT NULL
  AND t.namespace = $1
  AND ($4::text IS NULL OR t.queue = $4)
GROUP BY 1, 2
ORDER BY 1, 2
