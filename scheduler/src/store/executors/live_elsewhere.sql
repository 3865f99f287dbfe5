-- The queues and credentials refs of the live sessions (seen within $3 ms) of namespace $1's
-- executors other than $2, one row per executor: an empty array is every queue, or every
-- account's credentials. A routed claim reads it only when a sticky pool's recipient was last
-- sent to through an account the claiming executor does not hold.
SELECT s.queues, s.credentials
FROM herald.executor_sessions s
WHERE s.namespace = $1
  AND s.executor_id <> $2
  AND s.seen_at > herald.now() - $3 * interval '1 millisecond'
