-- Grants a routed claim's assignments (herald.grant_claim in
-- store/accounts/functions.sql): reserves account capacity, records recipient sends, gives back
-- unused slots; returns the assignments kept, each with its grant instant (the account's
-- reservation instant, or for an account with human-like gaps the drawn instant the send waits
-- for), which the lease (lease_assigned.sql) stamps it with.
-- $1 namespace; per assignment, in routing's order: $2 task id, $3 account, $4 high priority,
-- $5 opens a conversation, $6 recipient; $7 accounts that record sends per recipient.
SELECT g.out_id AS id, g.out_at AS granted_at
FROM herald.grant_claim($1, $2::uuid[], $3::text[], $4::boolean[], $5::boolean[], $6::text[],
                        $7::text[]) g
