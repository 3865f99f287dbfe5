-- Ends SUCCEEDED the tasks named by the reports ($2 tasks, $3 their message ids; namespace $1)
-- whose WhatsApp lease ran out without a report and that have not been leased again since
-- (migration 16): a status callback naming one means Meta accepted its message, so it must not
-- be sent a second time. A report on the message a window-closed fallback replaced (migration
-- 23) says nothing about the fallback's own send. Returns the tasks ended.
UPDATE herald.tasks t
SET state = 'succeeded',
    end_reason = 'sent',
    finished_at = herald.now(),
    updated_at = herald.now()
FROM unnest($2::uuid[], $3::text[]) AS n(task_id, provider_message_id)
WHERE t.id = n.task_id AND t.namespace = $1
  AND t.state = 'scheduled' AND t.awaiting_callback_until IS NOT NULL
  AND n.provider_message_id IS DISTINCT FROM t.fallback_replaces
RETURNING t.id
