-- Puts back, in the same transaction, the assignments of a routed claim that were leased before
-- the grant (see lease_assigned.sql) and that the grant refused: each is scheduled again exactly
-- as it was, so no lease, attempt number or account shows for a grant that never happened.
-- Per task: $1 id, $2 its prior leased_at, $3 its prior executor id, $4 its prior account.
UPDATE herald.tasks t
SET state = 'scheduled',
    lease_count = t.lease_count - 1,
    executor_id = s.executor_id,
    leased_at = s.leased_at,
    lease_expires_at = NULL,
    account_id = s.account_id
FROM unnest(herald.opaque_to_planner($1::uuid[]), herald.opaque_to_planner($2::timestamptz[]),
            herald.opaque_to_planner($3::text[]), herald.opaque_to_planner($4::text[]))
    AS s(id, leased_at, executor_id, account_id)
-- One primary-key probe per task, whatever the statistics say (see extend_leases.sql).
WHERE t.id = s.id AND t.state::text = 'leased'
