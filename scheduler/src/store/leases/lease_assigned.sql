-- Leases the tasks a routed claim assigned, each with its account (NULL: sent by queue) and
-- the instant its account's capacity was reserved (the grant time the limits were checked at).
UPDATE herald.tasks t
SET state = 'leased',
    lease_count = t.lease_count + 1,
    executor_id = $3,
    leased_at = COALESCE(a.granted_at, herald.clock()),
    lease_expires_at = COALESCE(a.granted_at, herald.clock())
                       + $4::bigint * interval '1 millisecond',
    account_id = COALESCE(a.account_id, t.account_id),
    updated_at = herald.now()
FROM unnest($1::uuid[], $2::text[], $5::timestamptz[]) AS a(id, account_id, granted_at)
-- = ANY($1) pins the update to primary-key lookups (see extend_leases.sql).
WHERE t.id = ANY($1::uuid[]) AND t.id = a.id AND t.state = 'scheduled'
-- The lease columns come from store/tasks/columns.rs (LEASE_COLUMNS).
RETURNING {lease_columns}, a.account_id,
          (SELECT credentials_ref FROM herald.accounts ac
           WHERE ac.namespace = t.namespace AND ac.id = a.account_id) AS credentials_ref
