-- Pushes the expiry of still-held leases one TTL from now; a lease no longer current (expired
-- and re-leased, or cancelled) matches nothing and is reported lost by the caller.
UPDATE herald.tasks t
SET lease_expires_at = herald.now() + $3::bigint * interval '1 millisecond',
    updated_at = herald.now()
FROM unnest(herald.opaque_to_planner($1::uuid[]), herald.opaque_to_planner($2::integer[]))
    AS l(id, attempt)
-- One primary-key probe per lease, whatever the statistics say. Given the batch's real size,
-- a batch of hundreds was planned as a hash join over a sequential scan of the whole table;
-- the arrays are hidden from the planner's estimates (migration 30), so the join is driven by
-- the batch. And the state is compared as text: `t.state = 'leased'` implies the predicate of
-- tasks_lease_expiry (and, before migration 31, tasks_pending_run_at's), and with 20,000 tasks
-- leased, fresh statistics and all, the planner walked tasks_lease_expiry for 500 leases
-- instead of probing for them (docs/performance.md, "Plans made on an empty table").
WHERE t.id = l.id AND t.lease_count = l.attempt
  AND t.state::text = 'leased' AND t.namespace = $4
RETURNING t.id AS task_id, t.lease_count AS attempt, t.lease_expires_at AS expires_at
