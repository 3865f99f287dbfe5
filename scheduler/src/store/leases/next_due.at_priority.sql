SELECT t.run_at
FROM herald.tasks t
WHERE t.state = 'scheduled'
  AND t.route = r.route
  AND t.priority = {priority}
  -- Where this level's look starts (lease/due_marks.rs), as in claim_due.at_priority.sql.
  AND t.run_at >= coalesce(($3::timestamptz[])[{priority} + 1], '-infinity')
  AND (t.expire_at IS NULL OR t.expire_at > herald.now())
  AND ($2::text[] IS NULL OR t.queue = ANY($2::text[]))
ORDER BY t.run_at
LIMIT 1
