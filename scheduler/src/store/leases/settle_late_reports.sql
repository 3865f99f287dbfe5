-- Settles OK reports on leases the sweeper already took back: the executor's stream was down
-- past the lease's TTL while the provider took the message, and the executor reports it once it
-- reconnects. If no lease came after the lapsed one (the task's lease_count is still the
-- report's attempt, and the sweeper's LEASE_EXPIRED row for it is still there), the message
-- went out and sending it again would send it twice: the task ends SUCCEEDED, and the attempt
-- row becomes the report's. The sweeper's charge of the attempt stays (it was one), and so
-- does its freeing of the account slot (the caller frees nothing). A task leased again since is
-- the new lease's to settle, and one that moved on otherwise (cancelled, ended by a callback,
-- retried by hand) is not touched, except a cancelled campaign's lapsed lease the sweeper ended
-- CANCELLED, unconfirmed (expire_leases.sql): the report tells it the message went. A report
-- on a message a status already said failed is not taken either: that failure scheduled the
-- task's retry or its window-closed fallback, which must still go. complete_attempts.sql handles every report on a live lease;
-- this statement runs only for the OK reports it refused, which are rare.
-- $1 namespace; per report: $2 task id, $3 attempt, $4 provider message id, $5 started_at,
-- $6 the report's note (an OK may carry one), $7 whether the window-closed fallback went.
WITH lapsed AS (
    SELECT i.*
    FROM unnest(herald.opaque_to_planner($2::uuid[]), $3::integer[], $4::text[],
                $5::timestamptz[], $6::text[], $7::boolean[])
        AS i(task_id, attempt, provider_message_id, started_at, note, fallback)
    JOIN herald.attempts a ON a.task_id = i.task_id AND a.attempt = i.attempt AND a.outcome = 6
),
settled AS (
    UPDATE herald.tasks t
    SET state = CASE WHEN t.state::text = 'cancelled' THEN t.state ELSE 'succeeded' END,
        end_reason = CASE WHEN t.state::text = 'cancelled' THEN t.end_reason ELSE 'sent' END,
        cancel_outcome = CASE WHEN t.state::text = 'cancelled' THEN 3 ELSE t.cancel_outcome END,
        end_code = NULL,
        finished_at = CASE WHEN t.state::text = 'cancelled' THEN t.finished_at
                           ELSE herald.now() END,
        awaiting_callback_until = NULL,
        window_closed_fallback_at = CASE
            WHEN l.fallback AND t.window_closed_fallback IS NOT NULL
                 AND t.window_closed_fallback_at IS NULL THEN herald.now()
            ELSE t.window_closed_fallback_at END,
        last_error = NULL,
        updated_at = herald.now()
    FROM lapsed l
    WHERE t.id = l.task_id AND t.lease_count = l.attempt AND t.namespace = $1
      -- What the sweeper leaves a lapsed lease in: due again, or ended by it.
      AND (t.state::text = 'scheduled'
           OR (t.state::text = 'failed' AND t.end_reason::text = 'exhausted')
           OR (t.state::text = 'expired' AND t.end_reason::text = 'expired')
           OR (t.state::text = 'cancelled' AND t.cancel_outcome = 5
               AND t.lease_expires_at IS NULL))
      AND NOT EXISTS (SELECT 1 FROM herald.delivery_events e
                      WHERE e.namespace = $1 AND e.provider_message_id = l.provider_message_id
                        AND e.state = 4)
    RETURNING t.id, t.lease_count, t.state, t.run_at, t.account_id, false AS was_cancelled
),
recorded AS (
    UPDATE herald.attempts a
    SET outcome = 1, error = l.note, provider_message_id = l.provider_message_id,
        started_at = l.started_at, window_closed_fallback = l.fallback
    FROM settled s
    JOIN lapsed l ON l.task_id = s.id
    WHERE a.task_id = s.id AND a.attempt = s.lease_count
)
SELECT id, lease_count, state::text AS state, run_at, account_id, was_cancelled,
       NULL::boolean AS counted_today
FROM settled
