-- The late path of the window-closed fallback (migration 25). Among the SUCCEEDED tasks $2
-- (namespace $1), those whose current message (herald.message_failure) the provider failed
-- after accepting it with 131047 (the recipient's 24-hour window was closed) and that have a
-- fallback never used go back to SCHEDULED, due now, with the fallback marked used: their next
-- lease sends the template in place of the content (LEASE_COLUMNS), and no lease carries it as
-- a fallback again. The failed message is remembered (fallback_replaces) so that its reports,
-- repeated or late, no longer make the task's delivery nor end it. Runs before
-- fail_delivered.sql, which then finds these tasks no longer SUCCEEDED. A repeat of the same
-- failure changes nothing: the fallback is used. A task whose campaign was cancelled is left to
-- end FAILED; one whose campaign is paused comes back parked (herald.campaign_hold). Returns the
-- tasks scheduled again.
-- A finished campaign one of these tasks belongs to is active again (herald.reopen_campaigns).
WITH revived AS (
    UPDATE herald.tasks t
    SET state = 'scheduled',
        route = herald.revived_route(t.route, t.campaign_id),
        run_at = herald.now(),
        window_closed_fallback_at = herald.now(),
        fallback_replaces = f.provider_message_id,
        finished_at = NULL,
        end_reason = NULL,
        end_code = NULL,
        awaiting_callback_until = NULL,
        last_error = format('delivery failed after acceptance: %s; sending the window-closed fallback',
                            concat_ws(' ', 'error ' || f.error_code::text, f.error)),
        updated_at = herald.now()
    FROM herald.tasks x
    CROSS JOIN LATERAL herald.message_failure(x.id, x.lease_count, x.fallback_replaces) f
    WHERE x.id = ANY($2::uuid[]) AND x.namespace = $1
      AND t.id = x.id AND t.state = 'succeeded'
      AND f.error_code = 131047
      AND t.window_closed_fallback IS NOT NULL AND t.window_closed_fallback_at IS NULL
      AND herald.campaign_hold(x.campaign_id) IS DISTINCT FROM 'cancelled'
    RETURNING t.id, t.campaign_id
),
reopened AS (
    SELECT herald.reopen_campaigns(array_agg(campaign_id)) AS n FROM revived
)
SELECT r.id FROM revived r, reopened
