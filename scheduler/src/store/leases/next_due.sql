-- How long until the earliest scheduled task of the routes in $1 becomes due, measured on the
-- database clock (negative when one is already due), and that due time. One index probe per
-- (route, priority), from the level's mark in $3 (lease/due_marks.rs): the placeholder below
-- becomes next_due.at_priority.sql once per level.
SELECT (extract(epoch FROM (min(n.run_at) - herald.now())) * 1000.0)::float8 AS wait_ms,
       min(n.run_at) AS run_at
FROM unnest($1::text[]) AS r(route)
CROSS JOIN LATERAL (
    {at_each_priority}
) n
