-- Lists recipients $2 of namespace $1 with reason $3 and note $4. A recipient already listed
-- keeps its entry (its first reason and time): listing again changes nothing. Returns the
-- entries, new or existing.
WITH input AS (
    SELECT DISTINCT herald.recipient_key(r) AS recipient FROM unnest($2::text[]) AS r
),
added AS (
    INSERT INTO herald.suppressions (namespace, recipient, reason, note)
    SELECT $1, i.recipient, $3::text::herald.suppression_reason, $4
    FROM input i
    ON CONFLICT (namespace, recipient) DO NOTHING
    RETURNING recipient, reason::text AS reason, note, created_at, true AS added
)
SELECT * FROM added
UNION ALL
SELECT s.recipient, s.reason::text, s.note, s.created_at, false
FROM herald.suppressions s JOIN input i ON s.recipient = i.recipient
-- The snapshot predates the insert above, so this arm sees only entries listed before.
WHERE s.namespace = $1
