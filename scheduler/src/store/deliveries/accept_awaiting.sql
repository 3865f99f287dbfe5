-- Ends SUCCEEDED the tasks among $2 (namespace $1) whose WhatsApp lease ran out without a report
-- and that have not been leased again since (migration 16): a status callback naming one means
-- Meta accepted its message, so it must not be sent a second time. Returns the tasks ended.
UPDATE herald.tasks t
SET state = 'succeeded',
    end_reason = 'sent',
    finished_at = herald.now(),
    updated_at = herald.now()
WHERE t.id = ANY($2::uuid[]) AND t.namespace = $1
  AND t.state = 'scheduled' AND t.awaiting_callback_until IS NOT NULL
RETURNING t.id
