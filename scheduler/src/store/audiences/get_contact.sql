-- One contact.
SELECT {contact_columns} FROM herald.contacts
WHERE namespace = $1 AND audience_id = $2 AND recipient = $3
