-- Why a task ended (#16 item 6). FAILED alone hid whether the attempts ran out, the provider
-- refused for good, the number was never valid or the message failed after the provider had
-- accepted it; a task that was never sent on purpose (suppressed, duplicate content) must not
-- read as a failure either. Set by every statement that ends a task, cleared by RetryTask, and
-- a plain column so ListTasks and bulk operations can filter on it with a WHERE.
CREATE TYPE herald.end_reason AS ENUM (
    -- The provider accepted the message (SUCCEEDED).
    'sent',
    -- Every attempt was used on passing failures or lapsed leases (FAILED).
    'exhausted',
    -- The provider refused the message for good; end_code holds its code when it gave one
    -- (FAILED).
    'permanent_error',
    -- The deadline passed before the message could be sent (EXPIRED).
    'expired',
    -- CancelTask or a campaign's cancellation (CANCELLED).
    'cancelled',
    -- The recipient is on the namespace's suppression list (CANCELLED, nothing sent).
    'suppressed',
    -- The provider says the recipient cannot receive messages at all (FAILED).
    'invalid_recipient',
    -- The same content went to the same recipient within the guard's window (CANCELLED,
    -- nothing sent).
    'duplicate_content',
    -- The provider accepted the message and reported later that it could not deliver it
    -- (FAILED; end_code holds the provider's code).
    'failed_after_acceptance'
);

ALTER TABLE herald.tasks
    ADD COLUMN end_reason herald.end_reason,
    -- The provider's error code behind a permanent_error, invalid_recipient or
    -- failed_after_acceptance, when it gave one.
    ADD COLUMN end_code bigint;

-- Tasks that ended before this migration: the closest reading of what is stored.
UPDATE herald.tasks SET end_reason = CASE
        WHEN state = 'succeeded' THEN 'sent'
        WHEN state = 'cancelled' THEN 'cancelled'
        WHEN state = 'expired' THEN 'expired'
        WHEN last_error LIKE 'delivery failed after acceptance%' THEN 'failed_after_acceptance'
        WHEN attempts >= max_attempts THEN 'exhausted'
        ELSE 'permanent_error'
    END::herald.end_reason
WHERE state IN ('succeeded', 'failed', 'cancelled', 'expired');

-- The provider's error code of an attempt, when the executor reported one.
ALTER TABLE herald.attempts ADD COLUMN error_code bigint;

-- DeliveryStats finds the messages accepted in a window by this index, then each one's later
-- reports through delivery_events_task.
CREATE INDEX delivery_events_accepted ON herald.delivery_events (namespace, occurred_at)
    WHERE state = 1 AND task_id IS NOT NULL;
