-- How long until the earliest scheduled task of the routes in $2 becomes due, measured on the
-- database clock (negative when one is already due), and that due time. One index probe per
-- (route, priority).
SELECT (extract(epoch FROM (min(n.run_at) - now())) * 1000.0)::float8, min(n.run_at)
FROM unnest($2::text[]) AS r(route)
CROSS JOIN unnest($1::smallint[]) AS p(priority)
CROSS JOIN LATERAL (
    SELECT t.run_at
    FROM herald.tasks t
    WHERE t.state = 'scheduled'
      AND t.route = r.route
      AND t.priority = p.priority
      AND (t.expire_at IS NULL OR t.expire_at > now())
      AND ($3::text[] IS NULL OR t.queue = ANY($3::text[]))
    ORDER BY t.run_at
    LIMIT 1
) n
