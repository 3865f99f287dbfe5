SELECT t.id, t.window_start IS NOT NULL AS windowed, t.namespace, t.recipient
FROM herald.tasks t
WHERE t.state = 'scheduled'
  AND t.route = $5
  AND t.priority = {priority}
  AND t.run_at <= herald.now()
  -- Past its deadline: the sweeper marks it EXPIRED; never send it late.
  AND (t.expire_at IS NULL OR t.expire_at > herald.now())
  AND ($1::text[] IS NULL OR t.queue = ANY($1::text[]))
ORDER BY t.run_at
LIMIT $2
FOR UPDATE SKIP LOCKED
