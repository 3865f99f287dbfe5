-- Sends of the campaigns $1 in each of the last $2 intervals of $3 ms (bucket 0 is the latest),
-- by the sent tasks' due times: an index-only range of tasks_campaign (campaign_id, state,
-- run_at), bounded by what the campaigns sent in that time.
SELECT t.campaign_id,
       floor(extract(epoch FROM herald.now() - t.run_at) * 1000 / $3::float8)::int AS bucket,
       count(*) AS sent
FROM herald.task_records t
WHERE t.campaign_id = ANY($1) AND t.state = 'succeeded'
  AND t.run_at > herald.now() - $2::float8 * $3::float8 * interval '1 millisecond'
  AND t.run_at <= herald.now()
GROUP BY 1, 2
