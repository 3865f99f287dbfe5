-- CreateCampaign's idempotency key: a retried call (after UNAVAILABLE, a timeout, a client
-- restart) finds the campaign its first try made instead of making a second one that messages
-- every recipient again. NULL for campaigns created without a key; unique per namespace.
ALTER TABLE herald.campaigns ADD COLUMN idempotency_key text;
CREATE UNIQUE INDEX campaigns_idempotency_key ON herald.campaigns (namespace, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
