-- One page of a namespace's tasks, newest first. Every filter is a parameter that may be NULL,
-- so one prepared statement serves all.
SELECT {task_columns}
FROM herald.tasks t
WHERE t.namespace = $1
  AND ($2::text[] IS NULL OR t.state::text = ANY($2))
  AND ($3::text IS NULL OR t.queue = $3)
  AND ($4::timestamptz IS NULL OR t.created_at >= $4)
  AND ($5::timestamptz IS NULL OR t.created_at < $5)
  AND ($6::timestamptz IS NULL OR t.run_at >= $6)
  AND ($7::timestamptz IS NULL OR t.run_at < $7)
  AND ($8::uuid IS NULL OR t.id < $8)
  -- The console's search; each is served by an index of migration V14 (or the primary key, or
  -- tasks_campaign), so a page stays an index walk whatever is asked.
  AND ($10::text IS NULL OR t.recipient = $10)
  AND ($11::uuid IS NULL OR t.id = $11)
  AND ($12::uuid IS NULL OR t.campaign_id = $12)
  AND ($13::text IS NULL OR t.schedule_id = $13)
  AND ($14::text IS NULL OR t.account_id = $14)
ORDER BY t.id DESC
LIMIT $9
