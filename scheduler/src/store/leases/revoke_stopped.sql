-- Records that the executor dropped a cancelled task's lease before sending.
UPDATE herald.tasks
SET cancel_outcome = 2, updated_at = herald.now()
WHERE id = $1 AND lease_count = $2 AND state = 'cancelled' AND cancel_outcome = 5
  AND namespace = $3
