-- Inserts a campaign, created now by herald's clock (its start when it names none). A campaign
-- to an audience starts with its contacts still to add ($6), dates compared at $7.
INSERT INTO herald.campaigns (namespace, id, name, spec, pool, created_at, updated_at,
                              audience_pending, audience_at)
VALUES ($1, $2, $3, $4, $5, herald.now(), herald.now(), $6, $7)
RETURNING {campaign_columns}
