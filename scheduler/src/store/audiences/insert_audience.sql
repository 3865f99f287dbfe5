-- Inserts an audience; nothing when the id is taken.
INSERT INTO herald.audiences (namespace, id, channel, description, default_time_zone,
                              date_attributes)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT DO NOTHING
RETURNING {audience_columns}
