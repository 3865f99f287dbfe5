-- The credentials held by the live executors (seen within $3 ms) that serve queue $2 of
-- namespace $1, one row per executor: an empty array holds every account's. No row: none is
-- connected for the queue.
SELECT s.credentials
FROM herald.executor_sessions s
WHERE s.namespace = $1
  AND (s.queues = '{}' OR $2 = ANY(s.queues))
  AND s.seen_at > herald.now() - $3 * interval '1 millisecond'
