SELECT t.id,
       CASE WHEN t.window_start IS NULL THEN NULL
            ELSE herald.window_defer_to(t.id, t.window_start, t.window_end, t.window_zone,
                                        t.window_spread_ms, herald.now()) END AS defer_to
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
