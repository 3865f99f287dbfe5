-- Moves an audience's contact count by $3 (in the transaction that wrote the contacts).
UPDATE herald.audiences SET contact_count = contact_count + $3
WHERE namespace = $1 AND id = $2
RETURNING contact_count
