-- Locks a campaign: chunks of recipients, pause, resume and cancel of one campaign apply one at
-- a time.
SELECT state::text AS state, recipient_count FROM herald.campaigns
WHERE namespace = $1 AND id = $2
FOR UPDATE
