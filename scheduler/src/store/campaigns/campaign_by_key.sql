-- The campaign CreateCampaign made with idempotency key $2 in namespace $1, if any.
SELECT {campaign_columns} FROM herald.campaigns WHERE namespace = $1 AND idempotency_key = $2
