-- Accounts with released slots or successes waiting in account_deltas, per namespace, ids in the
-- order claims lock account rows: byte by byte (COLLATE "C"), as Rust sorts them, whatever the
-- database's collation.
SELECT d.namespace,
       array_agg(DISTINCT d.account_id COLLATE "C" ORDER BY d.account_id COLLATE "C") AS ids
FROM herald.account_deltas d
GROUP BY d.namespace
