-- Settles a routed claim's leases after the grant (see lease_assigned.sql), in the same
-- transaction: a kept paced send is leased from its drawn instant (the executor holds it until
-- then, and its lease runs from there); a refused assignment is scheduled again exactly as it
-- was, so no lease, attempt number or account shows for a grant that never happened.
-- Per task: $1 id, $2 kept, $3 the paced instant (kept) or the prior leased_at (refused),
-- $4 the prior executor id, $5 the prior account; $6 lease TTL in milliseconds.
-- Returns the kept tasks' new lease times.
UPDATE herald.tasks t
SET state = CASE WHEN s.kept THEN t.state ELSE 'scheduled' END,
    lease_count = CASE WHEN s.kept THEN t.lease_count ELSE t.lease_count - 1 END,
    executor_id = CASE WHEN s.kept THEN t.executor_id ELSE s.executor_id END,
    leased_at = s.at,
    lease_expires_at = CASE WHEN s.kept THEN s.at + $6::bigint * interval '1 millisecond' END,
    account_id = CASE WHEN s.kept THEN t.account_id ELSE s.account_id END
FROM unnest($1::uuid[], $2::boolean[], $3::timestamptz[], $4::text[], $5::text[])
    AS s(id, kept, at, executor_id, account_id)
-- = ANY($1) pins the update to primary-key lookups (see extend_leases.sql).
WHERE t.id = ANY($1::uuid[]) AND t.id = s.id AND t.state = 'leased'
RETURNING t.id, s.kept, t.leased_at, t.lease_expires_at AS expires_at,
          greatest(ceil(extract(epoch FROM t.leased_at - herald.clock()) * 1000), 0)::bigint
              AS send_after_ms
