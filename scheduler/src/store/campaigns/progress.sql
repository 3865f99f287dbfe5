-- A campaign's tasks by state: one GROUP BY that reads only the (campaign_id, state, run_at)
-- index.
SELECT state::text AS state, count(*) AS tasks, max(run_at) AS last_due, herald.now() AS db_now
FROM herald.task_records
WHERE campaign_id = $1
GROUP BY state
