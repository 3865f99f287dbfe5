-- Removes one contact.
DELETE FROM herald.contacts WHERE namespace = $1 AND audience_id = $2 AND recipient = $3
