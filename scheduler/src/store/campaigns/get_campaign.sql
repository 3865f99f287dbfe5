-- One campaign.
SELECT {campaign_columns} FROM herald.campaigns WHERE namespace = $1 AND id = $2
