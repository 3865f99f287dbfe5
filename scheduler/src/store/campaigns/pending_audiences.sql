-- Campaigns with audience contacts still to add (any namespace), oldest first.
SELECT namespace, id FROM herald.campaigns
WHERE audience_pending
ORDER BY created_at
LIMIT $1
