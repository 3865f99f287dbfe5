-- Among the SUCCEEDED tasks $2 (namespace $1), those whose current message
-- (herald.message_failure) the provider failed after accepting it with a code worth trying
-- again ($3: throttles and temporary failures, as the senders class them at send time) and
-- whose attempts are not spent go back to SCHEDULED after their retry policy's next delay or the
-- code's least wait ($4, in ms, element for element), whichever is longer, as the answer at send
-- time would have. The accepted attempt stays as it was (it counted: `attempts` holds it), and the
-- failed message's reports, repeated or late, no longer judge the task once its next lease
-- sends again (herald.task_reports). A task whose next try would come at or past its expiry is
-- left to fail_delivered.sql, which runs after this and ends the rest, as is a task whose
-- campaign was cancelled or that ended more than a day ago; one whose campaign is paused comes back parked (herald.campaign_hold).
-- Returns the tasks scheduled again, with the code and when they are due.
-- A finished campaign one of these tasks belongs to is active again (herald.reopen_campaigns).
WITH revived AS (
    UPDATE herald.tasks t
    SET state = 'scheduled',
        route = herald.revived_route(t.route, t.campaign_id),
        run_at = n.next_run,
        finished_at = NULL,
        end_reason = NULL,
        end_code = NULL,
        awaiting_callback_until = NULL,
        last_error = format('delivery failed after acceptance: %s; trying again',
                            concat_ws(' ', 'error ' || f.error_code::text, f.error)),
        updated_at = herald.now()
    FROM herald.tasks x
    CROSS JOIN LATERAL herald.message_failure(x.id, x.lease_count, x.fallback_replaces) f
    JOIN unnest($3::bigint[], $4::bigint[]) AS c(code, least_wait_ms) ON c.code = f.error_code
    CROSS JOIN LATERAL (
        SELECT herald.now()
               + greatest(herald.retry_delay_ms(x.attempts, x.retry_delays_ms, x.backoff_initial_ms,
                                                x.backoff_max_ms, x.backoff_multiplier,
                                                x.backoff_jitter),
                          c.least_wait_ms)
                 * interval '1 millisecond' AS next_run
    ) n
    WHERE x.id = ANY($2::uuid[]) AND x.namespace = $1
      AND t.id = x.id AND t.state = 'succeeded'
      AND x.attempts < x.max_attempts
      -- A failure told long after the send (Meta redelivers a webhook for up to seven days) would
      -- send a message days late: past a day it ends the task instead.
      AND x.finished_at > herald.now() - interval '1 day'
      AND herald.campaign_hold(x.campaign_id) IS DISTINCT FROM 'cancelled'
      AND (x.expire_at IS NULL OR n.next_run < x.expire_at)
    RETURNING t.id, f.error_code, t.run_at, t.campaign_id
),
reopened AS (
    SELECT herald.reopen_campaigns(array_agg(campaign_id)) AS n FROM revived
)
SELECT r.id, r.error_code, r.run_at FROM revived r, reopened
