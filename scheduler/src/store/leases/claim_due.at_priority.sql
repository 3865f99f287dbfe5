SELECT t.id, t.window_start IS NOT NULL AS windowed, t.namespace, t.recipient
FROM herald.tasks t
WHERE t.state = 'scheduled'
  AND t.route = $5
  AND t.priority = {priority}
  AND t.run_at <= herald.now()
  -- Where this level's walk starts (lease/due_marks.rs): past the entries the dispatcher's
  -- earlier full batches leased, which a held snapshot keeps in the index.
  AND t.run_at >= coalesce(($6::timestamptz[])[{priority} + 1], '-infinity')
  -- Past its deadline: the sweeper marks it EXPIRED; never send it late.
  AND (t.expire_at IS NULL OR t.expire_at > herald.now())
  AND ($1::text[] IS NULL OR t.queue = ANY($1::text[]))
ORDER BY t.run_at
LIMIT $2
FOR UPDATE SKIP LOCKED
