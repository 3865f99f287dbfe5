-- How long until the earliest scheduled task this session could claim becomes due, measured
-- on the database clock (negative when one is already due). One index probe per priority level.
SELECT (extract(epoch FROM (min(n.run_at) - now())) * 1000.0)::float8, min(n.run_at)
FROM unnest($1::smallint[]) AS p(priority)
CROSS JOIN LATERAL (
    SELECT t.run_at
    FROM herald.tasks t
    WHERE t.state = 'scheduled'
      AND t.priority = p.priority
      AND (t.expire_at IS NULL OR t.expire_at > now())
      AND ($2::text[] IS NULL OR t.queue = ANY($2::text[]))
    ORDER BY t.run_at
    LIMIT 1
) n
