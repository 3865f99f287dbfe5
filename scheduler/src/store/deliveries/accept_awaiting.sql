-- Ends SUCCEEDED the tasks named by the reports ($2 tasks, $3 their message ids; namespace $1)
-- whose WhatsApp lease ran out without a report and that have not been leased again since
-- (migration 16): a status callback naming one means Meta accepted its message, so it must not
-- be sent a second time. Only a report on the task's current message counts
-- (herald.task_reports; the reports are recorded before this runs): one on the message a
-- window-closed fallback replaced, or that an earlier attempt sent, says nothing about the
-- last send. Returns the tasks ended.
UPDATE herald.tasks t
SET state = 'succeeded',
    end_reason = 'sent',
    finished_at = herald.now(),
    updated_at = herald.now()
FROM unnest($2::uuid[], $3::text[]) AS n(task_id, provider_message_id)
WHERE t.id = n.task_id AND t.namespace = $1
  AND t.state = 'scheduled' AND t.awaiting_callback_until IS NOT NULL
  AND EXISTS (SELECT 1 FROM herald.task_reports(t.id, t.lease_count, t.fallback_replaces) r
              WHERE r.provider_message_id = n.provider_message_id)
RETURNING t.id
