-- Ends the SUCCEEDED tasks among $2 (namespace $1) whose current message the provider reported
-- failed after accepting it (herald.message_failure: not the message a window-closed fallback
-- replaced, nor one an earlier attempt sent): FAILED, with the provider's code and text as the
-- last error. The trigger on tasks raises `task.failed`. A task not yet SUCCEEDED (its report
-- has not come) is left for the report, which calls this again; one already FAILED matches
-- nothing, so a repeat is harmless. Returns the tasks ended, with the code.
-- finished_at becomes now: the task ends FAILED now, and the failure reports
-- (ListFailures, CountTasks) place it then, not at the send that seemed to succeed.
UPDATE herald.tasks t
SET state = 'failed',
    finished_at = herald.now(),
    end_reason = 'failed_after_acceptance',
    end_code = f.error_code,
    last_error = format('delivery failed after acceptance: %s',
                        concat_ws(' ', 'error ' || f.error_code::text, f.error)),
    updated_at = herald.now()
FROM herald.tasks x
CROSS JOIN LATERAL herald.message_failure(x.id, x.lease_count, x.fallback_replaces) f
WHERE x.id = ANY($2::uuid[]) AND x.namespace = $1
  AND t.id = x.id AND t.state = 'succeeded'
RETURNING t.id, f.error_code
