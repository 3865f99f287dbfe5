-- Of the tasks $2 that a report just rescheduled after a send whose answer was lost
-- (AttemptResult.outcome_unknown: the provider may have accepted the message), those sent
-- through an account whose provider reports on its messages (herald.reports_on_messages) wait
-- the grace $3 (ms) for a status callback naming the send before they are due again, as a
-- lease that lapsed unreported does (expire_leases.sql); callbacks::record ends them SUCCEEDED
-- if one comes (accept_awaiting.sql). A task whose current send a report already named (the
-- callback came before the executor gave up) ends SUCCEEDED now, its attempt row learning the
-- message it sent; one whose message a report says failed is left to its retry.
-- Returns the tasks changed, with their state and due time.
WITH candidates AS (
    SELECT t.id, t.lease_count,
           (SELECT r.provider_message_id
            FROM herald.task_reports(t.id, t.lease_count, t.fallback_replaces) r
            ORDER BY r.occurred_at LIMIT 1) AS sent_message,
           EXISTS (SELECT 1 FROM herald.message_failure(t.id, t.lease_count,
                                                        t.fallback_replaces)) AS failed
    FROM herald.tasks t
    WHERE t.id = ANY($2::uuid[]) AND t.namespace = $1 AND t.state = 'scheduled'
      AND herald.reports_on_messages(t.namespace, t.account_id)
),
changed AS (
    UPDATE herald.tasks t
    SET state = CASE WHEN c.sent_message IS NOT NULL THEN 'succeeded'
                     ELSE 'scheduled' END::herald.task_state,
        end_reason = CASE WHEN c.sent_message IS NOT NULL THEN 'sent' END::herald.end_reason,
        finished_at = CASE WHEN c.sent_message IS NOT NULL THEN herald.now() END,
        run_at = CASE WHEN c.sent_message IS NOT NULL THEN t.run_at
                      ELSE greatest(t.run_at, herald.now() + $3::bigint * interval '1 millisecond')
                 END,
        awaiting_callback_until = CASE WHEN c.sent_message IS NOT NULL THEN NULL
                                       ELSE herald.now() + $3::bigint * interval '1 millisecond'
                                  END,
        updated_at = herald.now()
    FROM candidates c
    WHERE t.id = c.id AND NOT c.failed
    RETURNING t.id, t.lease_count, t.state::text AS state, t.run_at, c.sent_message
),
pinned AS (
    UPDATE herald.attempts a
    SET provider_message_id = c.sent_message
    FROM changed c
    WHERE c.sent_message IS NOT NULL AND a.task_id = c.id AND a.attempt = c.lease_count
      AND a.provider_message_id IS NULL
)
SELECT id, state, run_at FROM changed
