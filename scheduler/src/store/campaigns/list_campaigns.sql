-- One page of a namespace's campaigns, newest first (ids are UUIDv7). $2: states to include
-- (NULL: all); $3: the page token's id (NULL: the first page).
SELECT {campaign_columns} FROM herald.campaigns
WHERE namespace = $1
  AND ($2::text[] IS NULL OR state::text = ANY($2))
  AND ($3::uuid IS NULL OR id < $3)
ORDER BY id DESC
LIMIT $4
