-- Ends, without sending, the SCHEDULED tasks among $1 (locked by the caller's claim) whose
-- recipient is on their namespace's suppression list: CANCELLED, nothing started, end reason
-- 'suppressed'. Returns the tasks ended. The state is compared as text, so the plan stays a
-- primary-key probe per id (see store/leases/extend_leases.sql).
UPDATE herald.tasks t
SET state = 'cancelled',
    end_reason = 'suppressed',
    cancel_outcome = 1,
    last_error = 'not sent: the recipient is on the suppression list',
    finished_at = herald.now(),
    updated_at = herald.now()
WHERE t.id = ANY($1::uuid[]) AND t.state::text = 'scheduled'
  AND EXISTS (SELECT 1 FROM herald.suppressions s
              WHERE s.namespace = t.namespace AND s.recipient = herald.recipient_key(t.recipient))
RETURNING t.id
