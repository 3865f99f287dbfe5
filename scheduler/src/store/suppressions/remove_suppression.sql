-- Takes recipient $2 off namespace $1's suppression list; returns the entry removed.
DELETE FROM herald.suppressions
WHERE namespace = $1 AND recipient = herald.recipient_key($2)
RETURNING recipient, reason::text AS reason, note, created_at
