-- Of the tasks $2 that a report just ended or rescheduled after a send whose answer was lost
-- (AttemptResult.outcome_unknown: the provider may have accepted the message), those sent
-- through an account whose provider reports on its messages (herald.reports_on_messages):
-- - a report on the current send came already (the callback beat the executor's timeout): the
--   message went out, so the task ends SUCCEEDED now, its attempt row learning the message;
--   when that report is a failure, the caller settles it as a late failure
--   (callbacks::settle_failures), as the sweep of a lapsed lease does;
-- - else a task the report rescheduled waits the grace $3 (ms) for a status callback naming
--   the send before it is due again, as a lease that lapsed unreported does
--   (expire_leases.sql); callbacks::record ends it SUCCEEDED if one comes
--   (accept_awaiting.sql). One the report ended (its last attempt, or past its expiry) stays
--   ended, marked as waiting too, so that a callback coming later ends it SUCCEEDED.
-- Callers hold lock_tasks.sql's locks on $2. Returns the tasks changed, with their state, due
-- time and whether the report that proved the send is a failure.
WITH candidates AS (
    SELECT t.id, t.lease_count, t.state,
           (SELECT r.provider_message_id
            FROM herald.task_reports(t.id, t.lease_count, t.fallback_replaces) r
            ORDER BY r.occurred_at LIMIT 1) AS sent_message,
           EXISTS (SELECT 1 FROM herald.message_failure(t.id, t.lease_count,
                                                        t.fallback_replaces)) AS failed
    FROM herald.tasks t
    WHERE t.id = ANY($2::uuid[]) AND t.namespace = $1
      AND (t.state = 'scheduled'
           OR (t.state IN ('failed', 'expired') AND t.end_reason IN ('exhausted', 'expired')))
      AND herald.reports_on_messages(t.namespace, t.account_id)
),
changed AS (
    UPDATE herald.tasks t
    SET state = CASE WHEN c.sent_message IS NOT NULL THEN 'succeeded'
                     ELSE t.state END,
        end_reason = CASE WHEN c.sent_message IS NOT NULL THEN 'sent'::herald.end_reason
                          ELSE t.end_reason END,
        finished_at = CASE WHEN c.sent_message IS NOT NULL THEN herald.now()
                           ELSE t.finished_at END,
        run_at = CASE WHEN c.sent_message IS NOT NULL OR c.state <> 'scheduled' THEN t.run_at
                      ELSE greatest(t.run_at, herald.now() + $3::bigint * interval '1 millisecond')
                 END,
        awaiting_callback_until = CASE WHEN c.sent_message IS NOT NULL THEN NULL
                                       ELSE herald.now() + $3::bigint * interval '1 millisecond'
                                  END,
        updated_at = herald.now()
    FROM candidates c
    WHERE t.id = c.id
    RETURNING t.id, t.lease_count, t.state::text AS state, t.run_at, c.sent_message, c.failed,
              c.state <> 'scheduled' AS was_ended
),
-- A task the report had just ended FAILED or EXPIRED queued its task.failed or task.expired
-- notification in this transaction (tasks_notify_ended, migration 5), and it succeeded after
-- all: the notification is withdrawn before anyone is told the message failed. Rows this
-- transaction queued are those created at its start (now()); one queued before stays.
withdrawn AS (
    DELETE FROM herald.notifications n
    USING changed c
    WHERE c.sent_message IS NOT NULL AND c.was_ended
      AND n.created_at = now()
      AND n.event IN ('task.failed', 'task.expired')
      AND n.payload -> 'data' ->> 'task_id' = c.id::text
),
pinned AS (
    UPDATE herald.attempts a
    SET provider_message_id = c.sent_message
    FROM changed c
    WHERE c.sent_message IS NOT NULL AND a.task_id = c.id AND a.attempt = c.lease_count
      AND a.provider_message_id IS NULL
)
-- An ended task only marked as waiting has not changed.
SELECT id, state, run_at, failed FROM changed WHERE sent_message IS NOT NULL OR NOT was_ended
