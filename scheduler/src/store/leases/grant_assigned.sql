-- Grants a routed claim's assignments (herald.grant_claim in
-- store/accounts/functions.sql): reserves account capacity, records recipient sends, gives back
-- unused slots; returns the assignments kept, each with its account and grant instant (paced:
-- a drawn instant the send waits for).
-- $1 namespace; per assignment, in routing's order: $2 task id, $3 account, $4 high priority,
-- $5 opens a conversation, $6 recipient; $7 accounts that record sends per recipient.
SELECT g.out_id AS id, g.out_account AS account_id, g.out_at AS granted_at, g.out_paced AS paced
FROM herald.grant_claim($1, $2::uuid[], $3::text[], $4::boolean[], $5::boolean[], $6::text[],
                        $7::text[]) g
