-- Leases what herald.grant_claim granted of a routed claim's assignments (see
-- LeaseRepo::grant), each from the instant the grant returned for it: its account's
-- reservation instant, or for an account with human-like gaps the instant it drew; NULL (sent by
-- queue) is now. Each task gets its account (NULL: sent by queue). Every task here is locked since
-- claim_candidates.sql and still scheduled; an assignment the grant refused is not leased.
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
