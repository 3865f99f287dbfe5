-- Replaces one contact's fields but its recipient.
UPDATE herald.contacts
SET name = $4, time_zone = $5, locale = $6, tags = $7, attributes = $8, updated_at = now()
WHERE namespace = $1 AND audience_id = $2 AND recipient = $3
RETURNING {contact_columns}
