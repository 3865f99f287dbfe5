-- Parks a campaign's live tasks: the claim never probes a 'paused:' route. A claim that locked
-- some of these rows first finishes leasing them (they are then LEASED, and parked too, so a
-- retry stays parked).
UPDATE herald.tasks SET route = 'paused:' || route, updated_at = herald.now()
WHERE campaign_id = $1 AND state IN ('scheduled', 'leased') AND route NOT LIKE 'paused:%'
