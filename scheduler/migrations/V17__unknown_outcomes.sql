-- Unknown outcomes without double sends (#15 item 4). When a lease through a WhatsApp Cloud
-- account runs out without a report, the executor may have crashed after Meta accepted the
-- message. The task then waits a grace (HERALD_UNKNOWN_OUTCOME_GRACE, default 2 minutes)
-- before it can be leased again: a status callback naming it (biz_opaque_callback_data is
-- `<task id>/<attempt>`) in the meantime means the message went out, and the task ends
-- SUCCEEDED without a second send.
ALTER TABLE herald.tasks
    -- Set when such a lease ran out: the end of the grace. A later status callback naming the
    -- task ends it SUCCEEDED while it is still SCHEDULED.
    ADD COLUMN awaiting_callback_until timestamptz;
