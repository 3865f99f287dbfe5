-- Leases a routed claim's assignments: those to accounts without human-like gaps before
-- herald.grant_claim decides which it grants (see LeaseRepo::grant), so that the account rows
-- are locked from the reservation to the commit and this update, the largest part of the
-- grant, does not run inside that lock (docs/performance.md, S5); those to paced accounts after
-- it, from the instants it drew. Each task gets its account (NULL: sent by queue) and its
-- lease's grant time: its instant, or now. return_refused.sql puts back assignments leased
-- before the grant that it refused, as claim_candidates.sql read them.
-- $1 task ids, $2 their accounts, $3 executor id, $4 lease TTL in milliseconds, $5 their
-- instants (NULL: now), $6 their accounts' credentials refs (from the claim's budgets: looked up
-- here, one primary-key probe per task was an eighth of this statement's buffer reads in S5).
UPDATE herald.tasks t
SET state = 'leased',
    lease_count = t.lease_count + 1,
    executor_id = $3,
    leased_at = COALESCE(a.at, herald.clock()),
    lease_expires_at = COALESCE(a.at, herald.clock()) + $4::bigint * interval '1 millisecond',
    account_id = COALESCE(a.account_id, t.account_id),
    updated_at = herald.now()
FROM unnest(herald.opaque_to_planner($1::uuid[]), herald.opaque_to_planner($2::text[]),
            herald.opaque_to_planner($5::timestamptz[]), herald.opaque_to_planner($6::text[]))
    AS a(id, account_id, at, credentials_ref)
-- One primary-key probe per assignment, whatever the statistics say (see extend_leases.sql).
WHERE t.id = a.id AND t.state::text = 'scheduled'
-- The lease columns come from store/tasks/columns.rs (LEASE_COLUMNS).
RETURNING {lease_columns}, a.account_id, a.credentials_ref
