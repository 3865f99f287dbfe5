SELECT t.run_at
FROM herald.tasks t
WHERE t.state = 'scheduled'
  AND t.route = r.route
  AND t.priority = {priority}
  AND (t.expire_at IS NULL OR t.expire_at > herald.now())
  AND ($2::text[] IS NULL OR t.queue = ANY($2::text[]))
ORDER BY t.run_at
LIMIT 1
