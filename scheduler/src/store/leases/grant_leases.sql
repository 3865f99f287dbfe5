-- Grants a routed claim's assignments and leases what was granted, in one round trip:
-- herald.grant_claim (store/accounts/functions.sql) reserves account capacity, records
-- recipient sends and gives back unused slots; the update leases the tasks it kept, each with
-- its account (NULL: sent by queue) and the instant its account's capacity was reserved (the
-- grant time the limits were checked at; the lease's own for tasks sent by queue).
-- $1 namespace; per assignment, in routing's order: $2 task id, $3 account, $4 high priority,
-- $5 opens a conversation, $6 recipient; $7 accounts that record sends per recipient;
-- $8 executor id; $9 lease TTL in milliseconds.
WITH granted AS MATERIALIZED (
    SELECT g.out_id AS id, g.out_account AS account_id, g.out_at AS granted_at
    FROM herald.grant_claim($1, $2::uuid[], $3::text[], $4::boolean[], $5::boolean[],
                            $6::text[], $7::text[]) g
)
UPDATE herald.tasks t
SET state = 'leased',
    lease_count = t.lease_count + 1,
    executor_id = $8,
    leased_at = COALESCE(a.granted_at, herald.clock()),
    lease_expires_at = COALESCE(a.granted_at, herald.clock())
                       + $9::bigint * interval '1 millisecond',
    account_id = COALESCE(a.account_id, t.account_id),
    updated_at = herald.now()
FROM granted a
-- = ANY($2) pins the update to primary-key lookups (see extend_leases.sql).
WHERE t.id = ANY($2::uuid[]) AND t.id = a.id AND t.state = 'scheduled'
-- The lease columns come from store/tasks/columns.rs (LEASE_COLUMNS).
RETURNING {lease_columns}, a.account_id,
          (SELECT credentials_ref FROM herald.accounts ac
           WHERE ac.namespace = t.namespace AND ac.id = a.account_id) AS credentials_ref
