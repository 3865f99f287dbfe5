-- Adds $3 to a campaign's recipient count and returns the new total.
UPDATE herald.campaigns
SET recipient_count = recipient_count + $3, updated_at = herald.now()
WHERE namespace = $1 AND id = $2
RETURNING recipient_count
