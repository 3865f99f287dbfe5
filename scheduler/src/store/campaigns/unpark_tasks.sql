-- Unparks a campaign's live tasks.
UPDATE herald.tasks SET route = substr(route, 8), updated_at = herald.now()
WHERE campaign_id = $1 AND state IN ('scheduled', 'leased') AND route LIKE 'paused:%'
