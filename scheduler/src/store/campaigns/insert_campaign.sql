-- Inserts a campaign, created now by herald's clock (its start when it names none). A campaign
-- to an audience starts with its contacts still to add ($6), dates compared at $7. With an
-- idempotency key ($8) taken in the namespace nothing is inserted and nothing returned: the
-- caller reads the campaign that holds it (campaign_by_key.sql).
INSERT INTO herald.campaigns (namespace, id, name, spec, pool, created_at, updated_at,
                              audience_pending, audience_at, idempotency_key)
VALUES ($1, $2, $3, $4, $5, herald.now(), herald.now(), $6, $7, $8)
ON CONFLICT (namespace, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING {campaign_columns}
