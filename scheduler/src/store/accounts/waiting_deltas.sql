-- Accounts with released slots or successes waiting in account_deltas, per namespace, ids in the
-- order claims lock account rows.
SELECT d.namespace, array_agg(DISTINCT d.account_id ORDER BY d.account_id) AS ids
FROM herald.account_deltas d
GROUP BY d.namespace
