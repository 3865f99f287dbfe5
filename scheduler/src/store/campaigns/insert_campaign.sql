-- Inserts a campaign, created now by herald's clock (its start when it names none).
INSERT INTO herald.campaigns (namespace, id, name, spec, pool, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, herald.now(), herald.now())
RETURNING {campaign_columns}
