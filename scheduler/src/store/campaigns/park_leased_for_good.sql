-- Parks a cancelled campaign's leased tasks for good, so a send that fails after the cancel is
-- never retried; returns them for revoking. Run after cancel_scheduled.sql, so a task a
-- concurrent claim leased meanwhile is seen here, and both again until neither finds a task (a
-- report committed while this waited may have made a leased task SCHEDULED again).
UPDATE herald.tasks SET route = 'cancelled:' || route
WHERE campaign_id = $1 AND state = 'leased' AND route NOT LIKE 'cancelled:%'
RETURNING id
