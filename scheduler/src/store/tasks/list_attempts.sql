-- Every attempt of one task of the namespace, oldest first.
SELECT a.task_id, a.attempt, a.executor_id, a.account, a.outcome, a.error,
       a.provider_message_id, a.retry_after_ms, a.leased_at, a.finished_at,
       a.window_closed_fallback
FROM herald.attempt_records a
JOIN herald.task_records t ON t.id = a.task_id AND t.namespace = $2
WHERE a.task_id = $1
ORDER BY a.attempt
