-- Leases a routed claim's assignments before herald.grant_claim decides which it grants (see
-- LeaseRepo::grant): the account rows are locked from the reservation to the commit, and this
-- update, the largest part of the grant, no longer runs inside that lock (docs/performance.md,
-- S5). Each task gets its account (NULL: sent by queue) and the lease's own grant time;
-- settle_grants.sql re-times paced sends and returns the assignments the grant refused to
-- scheduled, as claim_candidates.sql read them.
-- $1 task ids, $2 their accounts, $3 executor id, $4 lease TTL in milliseconds.
UPDATE herald.tasks t
SET state = 'leased',
    lease_count = t.lease_count + 1,
    executor_id = $3,
    leased_at = herald.clock(),
    lease_expires_at = herald.clock() + $4::bigint * interval '1 millisecond',
    account_id = COALESCE(a.account_id, t.account_id),
    updated_at = herald.now()
FROM unnest($1::uuid[], $2::text[]) AS a(id, account_id)
-- = ANY($1) pins the update to primary-key lookups (see extend_leases.sql).
WHERE t.id = ANY($1::uuid[]) AND t.id = a.id AND t.state = 'scheduled'
-- The lease columns come from store/tasks/columns.rs (LEASE_COLUMNS).
RETURNING {lease_columns}, a.account_id,
          (SELECT credentials_ref FROM herald.accounts ac
           WHERE ac.namespace = t.namespace AND ac.id = a.account_id) AS credentials_ref
