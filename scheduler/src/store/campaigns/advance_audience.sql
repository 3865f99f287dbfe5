-- Moves a campaign's audience cursor from $3 to $4 after a page was added; $5: more pages
-- follow; $6: why it stopped early (NULL when it did not). Fenced by the cursor read: a
-- replica that handled the same page later moves nothing back.
UPDATE herald.campaigns
SET audience_after = $4, audience_pending = $5, audience_error = $6, updated_at = herald.now()
WHERE namespace = $1 AND id = $2 AND audience_pending AND audience_after = $3
