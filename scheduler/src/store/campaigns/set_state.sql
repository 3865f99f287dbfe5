-- Sets a campaign's state.
UPDATE herald.campaigns SET state = $3::text::herald.campaign_state, updated_at = herald.now()
WHERE namespace = $1 AND id = $2
