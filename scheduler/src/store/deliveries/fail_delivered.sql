-- Ends the SUCCEEDED tasks among $2 (namespace $1) whose message the provider reported failed
-- after accepting it: FAILED, with the provider's code and text as the last error. The trigger
-- on tasks raises `task.failed`. A task not yet SUCCEEDED (its report has not come) is left for
-- the report, which calls this again; one already FAILED matches nothing, so a repeat is
-- harmless. The message a window-closed fallback replaced (migration 25) no longer speaks for
-- its task, nor does a message an earlier attempt sent (the task was retried since, and a new
-- attempt sent it again): only a failure of the task's current message ends it. Returns the
-- tasks ended, with the code.
UPDATE herald.tasks t
SET state = 'failed',
    end_reason = 'failed_after_acceptance',
    end_code = f.error_code,
    last_error = format('delivery failed after acceptance: %s',
                        concat_ws(' ', 'error ' || f.error_code::text, f.error)),
    updated_at = herald.now()
FROM (
    SELECT DISTINCT ON (e.task_id) e.task_id, e.error_code, e.error
    FROM herald.delivery_events e
    JOIN herald.tasks r ON r.id = e.task_id
    WHERE e.task_id = ANY($2::uuid[]) AND e.namespace = $1 AND e.state = 4
      AND e.provider_message_id IS DISTINCT FROM r.fallback_replaces
      AND NOT EXISTS (SELECT 1 FROM herald.attempts a
                      WHERE a.task_id = e.task_id AND a.attempt < r.lease_count
                        AND a.provider_message_id = e.provider_message_id)
    ORDER BY e.task_id, e.occurred_at
) f
WHERE t.id = f.task_id AND t.namespace = $1 AND t.state = 'succeeded'
RETURNING t.id, f.error_code
