-- Inserts one contact; nothing when the audience has that recipient.
INSERT INTO herald.contacts (namespace, audience_id, recipient, name, time_zone, locale, tags,
                             attributes)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT DO NOTHING
RETURNING {contact_columns}
