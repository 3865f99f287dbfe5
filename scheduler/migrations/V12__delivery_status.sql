-- Delivery truth: what providers report about a message after accepting it (WhatsApp status
-- callbacks, docs/senders.md#status-callbacks). Each report is kept as it came, once per
-- (message id, state), so callbacks delivered twice, out of order or before the send's own
-- report all fold into the same answer: a task's delivery is read from its rows (the furthest
-- state, the first time of each), never overwritten.
CREATE TABLE herald.delivery_events (
    namespace           text NOT NULL,
    -- The provider's message id (WhatsApp's wamid).
    provider_message_id text NOT NULL,
    -- herald.v1.DeliveryState: 1 accepted (the send's report, or WhatsApp's `sent`),
    -- 2 delivered, 3 read, 4 failed after acceptance.
    state               smallint NOT NULL CHECK (state BETWEEN 1 AND 4),
    -- The task the message was sent for: from the callback data the send carried, or from the
    -- send's report naming the message id. NULL until one of them is known.
    task_id             uuid,
    -- When the provider says it happened (for `accepted` from a report: when it was recorded).
    occurred_at         timestamptz NOT NULL,
    -- A failure's provider error code and text.
    error_code          bigint,
    error               text,
    recorded_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, provider_message_id, state)
);
-- A task's delivery is read by task.
CREATE INDEX delivery_events_task ON herald.delivery_events (task_id) WHERE task_id IS NOT NULL;
-- Retention drops reports no task ever claimed.
CREATE INDEX delivery_events_unclaimed ON herald.delivery_events (recorded_at)
    WHERE task_id IS NULL;
