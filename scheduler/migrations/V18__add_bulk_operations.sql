-- Bulk operations (StartBulkOperation): a cancel, retry or reschedule of every task a filter
-- selects, applied in batches by whichever replica locks the row first. Each batch commits the
-- task changes and the advanced cursor together, so a restart resumes exactly after the last
-- committed batch.
CREATE TABLE herald.bulk_operations (
    namespace   text NOT NULL,
    id          uuid NOT NULL,
    -- 'cancel' | 'retry' | 'reschedule'.
    action      text NOT NULL,
    -- herald.v1.TaskFilter, prost-encoded, states narrowed to the action's: a filter added to
    -- the wire message needs no migration.
    filter      bytea NOT NULL,
    -- Reschedule: the new due time, or the shift in milliseconds.
    run_at      timestamptz,
    shift_ms    bigint,
    -- 'running' | 'done'.
    state       text NOT NULL DEFAULT 'running',
    matched     bigint NOT NULL,
    processed   bigint NOT NULL DEFAULT 0,
    changed     bigint NOT NULL DEFAULT 0,
    -- The last task id handled: batches walk the selection in id order.
    cursor_id   uuid,
    -- Only tasks created by then are selected (the same clock as tasks.created_at).
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    PRIMARY KEY (namespace, id)
);
-- The workers' probe for unfinished operations.
CREATE INDEX bulk_operations_running ON herald.bulk_operations (created_at)
    WHERE state = 'running';
-- Campaign and schedule filters of ListTasks and bulk operations walk tasks by id.
CREATE INDEX tasks_campaign_id ON herald.tasks (campaign_id, id) WHERE campaign_id IS NOT NULL;
CREATE INDEX tasks_schedule_id ON herald.tasks (schedule_id, id) WHERE schedule_id IS NOT NULL;
