-- One page of a namespace's campaigns, newest first (ids are UUIDv7, so they sort by creation);
-- a walk of the primary key.
SELECT {campaign_columns}
FROM herald.campaigns
WHERE namespace = $1 AND ($2::uuid IS NULL OR id < $2)
ORDER BY id DESC
LIMIT $3
