-- Which of the SUCCEEDED tasks $2 (namespace $1) have a failure after acceptance reported on
-- their current message (herald.message_failure): the only ones the statements that follow a
-- report batch (window_closed.sql, retry_delivered.sql, fail_delivered.sql) can change. Asked
-- once, so a batch whose sends all went well (nearly every one) probes each task once rather
-- than once per statement.
SELECT x.id
FROM herald.tasks x
WHERE x.id = ANY($2::uuid[]) AND x.namespace = $1 AND x.state = 'succeeded'
  AND EXISTS (SELECT 1 FROM herald.message_failure(x.id, x.lease_count, x.fallback_replaces))
