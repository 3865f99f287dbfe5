-- Takes recipient $2 off namespace $1's suppression list, with the entries of the other names a
-- provider knows them by (herald.recipient_aliases_of): one person taken off is messaged under
-- either name again. Returns one entry removed: $2's own when it was listed.
WITH key AS (
    SELECT herald.recipient_key($2) AS recipient
),
removed AS (
    DELETE FROM herald.suppressions s
    USING key k
    WHERE s.namespace = $1
      AND (s.recipient = k.recipient
           OR s.recipient IN (SELECT o.other
                              FROM herald.recipient_aliases_of($1, ARRAY[k.recipient]) o))
    RETURNING s.recipient, s.reason::text AS reason, s.note, s.created_at
)
SELECT r.* FROM removed r, key k
ORDER BY r.recipient = k.recipient DESC
LIMIT 1
