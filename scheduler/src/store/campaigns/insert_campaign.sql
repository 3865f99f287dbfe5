-- Inserts a campaign.
INSERT INTO herald.campaigns (namespace, id, name, spec, pool)
VALUES ($1, $2, $3, $4, $5)
RETURNING {campaign_columns}
