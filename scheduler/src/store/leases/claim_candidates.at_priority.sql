SELECT t.id, t.route, t.recipient, t.priority, t.queue, t.run_at,
       t.window_start IS NOT NULL AS windowed
FROM herald.tasks t
WHERE t.state = 'scheduled'
  AND t.route = r.route
  AND t.priority = {priority}
  AND t.run_at <= herald.now()
  AND (t.expire_at IS NULL OR t.expire_at > herald.now())
  AND ($5::text[] IS NULL OR t.queue = ANY($5::text[]))
ORDER BY t.run_at
LIMIT r.lim
FOR UPDATE SKIP LOCKED
