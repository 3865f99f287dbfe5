-- Cancels a campaign's scheduled tasks.
UPDATE herald.tasks
SET state = 'cancelled', end_reason = 'cancelled', cancel_outcome = 1, finished_at = herald.now(), updated_at = herald.now()
WHERE campaign_id = $1 AND state = 'scheduled'
