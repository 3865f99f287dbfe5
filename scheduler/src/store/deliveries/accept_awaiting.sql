-- Ends SUCCEEDED the tasks named by the reports ($2 tasks, $3 their message ids; namespace $1)
-- whose WhatsApp lease ran out without a report and that have not been leased again since
-- (migration 16): a status callback naming one means Meta accepted its message, so it must not
-- be sent a second time. Only a report on the task's current message counts
-- (herald.task_reports; the reports are recorded before this runs): one on the message a
-- window-closed fallback replaced, or that an earlier attempt sent, says nothing about the
-- last send. The lapsed attempt's row learns the message it sent, as a report would have told
-- it: herald.task_reports knows an earlier attempt's message by that row, so a failure of this
-- message reported after the task was sent again (a late 131049 retried, say) is not taken
-- for the new send's, which would retry the task again at every report until its attempts ran
-- out. A task whose last attempt (or whose expiry) ended it while it waited (FAILED or EXPIRED,
-- exhausted or expired, with awaiting_callback_until set) is ended SUCCEEDED the same way: its
-- message went out, and leaving it FAILED showed a delivered message among the failures.
-- Returns the tasks ended.
WITH ended AS (
    UPDATE herald.tasks t
    SET state = 'succeeded',
        end_reason = 'sent',
        finished_at = herald.now(),
        awaiting_callback_until = NULL,
        updated_at = herald.now()
    FROM unnest($2::uuid[], $3::text[]) AS n(task_id, provider_message_id)
    WHERE t.id = n.task_id AND t.namespace = $1
      AND t.awaiting_callback_until IS NOT NULL
      AND (t.state = 'scheduled'
           OR (t.state IN ('failed', 'expired') AND t.end_reason IN ('exhausted', 'expired')))
      AND EXISTS (SELECT 1 FROM herald.task_reports(t.id, t.lease_count, t.fallback_replaces) r
                  WHERE r.provider_message_id = n.provider_message_id)
    RETURNING t.id, t.lease_count, n.provider_message_id
),
pinned AS (
    UPDATE herald.attempts a
    SET provider_message_id = e.provider_message_id
    FROM ended e
    WHERE a.task_id = e.id AND a.attempt = e.lease_count AND a.provider_message_id IS NULL
)
SELECT id FROM ended
