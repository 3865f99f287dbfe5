-- Re-drives a FAILED task with a fresh attempt budget; lease_count keeps growing so the fencing
-- tokens of earlier attempts stay stale. Not a task whose campaign was cancelled; one whose
-- campaign is paused comes back parked until it resumes (herald.campaign_hold).
-- A finished campaign one of these tasks belongs to is active again (herald.reopen_campaigns).
WITH revived AS (
    UPDATE herald.tasks
    SET state = 'scheduled',
        route = herald.revived_route(route, campaign_id),
        attempts = 0,
        run_at = COALESCE($3, herald.now()),
        finished_at = NULL,
        end_reason = NULL,
        end_code = NULL,
        updated_at = herald.now()
    WHERE id = $1 AND namespace = $2 AND state = 'failed'
      AND herald.campaign_hold(campaign_id) IS DISTINCT FROM 'cancelled'
    RETURNING id, campaign_id
),
reopened AS (
    SELECT herald.reopen_campaigns(array_agg(campaign_id)) AS n FROM revived
)
SELECT r.id FROM revived r, reopened
