-- The oldest unfinished operation no other replica is working on, locked until this batch's
-- transaction ends: a replica killed mid-batch rolls back and its lock goes with it, so any
-- replica picks the operation up again.
SELECT {operation_columns}, namespace FROM herald.bulk_operations
WHERE state = 'running'
ORDER BY created_at
LIMIT 1
FOR UPDATE SKIP LOCKED
