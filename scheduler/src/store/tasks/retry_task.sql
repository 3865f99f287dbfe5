-- Re-drives a FAILED task with a fresh attempt budget; lease_count keeps growing so the fencing
-- tokens of earlier attempts stay stale. Not a task whose campaign was cancelled; one whose
-- campaign is paused comes back parked until it resumes (herald.campaign_hold).
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
RETURNING id
