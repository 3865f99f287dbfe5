-- How long until the earliest scheduled task of the routes in $1 becomes due, measured on the
-- database clock (negative when one is already due), and that due time. One index probe per
-- (route, priority), from the level's mark in $3 (lease/due_marks.rs): the placeholder below
-- becomes next_due.at_priority.sql once per level.
-- The wait is measured from the clock at execution (herald.clock()), not the transaction's
-- start (herald.now()): a bind that plans the statement takes 2-3 ms in which the due time
-- comes closer, and measured from the start every idle dispatcher woke that much late (S3).
SELECT (extract(epoch FROM (min(n.run_at) - herald.clock())) * 1000.0)::float8 AS wait_ms,
       min(n.run_at) AS run_at
-- Hidden from the planner (migration 30) so that PostgreSQL settles on one generic plan.
FROM unnest(herald.opaque_to_planner($1::text[])) AS r(route)
CROSS JOIN LATERAL (
    {at_each_priority}
) n
