-- The LEASED tasks of namespace $1 to the recipients $2, or to another name a provider knows
-- one of them by (herald.recipient_aliases_of), compared as the suppression list does: what a
-- new suppression must still stop, since the claim checks the list only before it leases.
-- Leased tasks are what executors hold, a few thousand at most, so reading them all costs
-- little.
WITH keys AS (
    SELECT ARRAY(SELECT herald.recipient_key(r) FROM unnest($2::text[]) AS r) AS listed
),
names AS (
    SELECT k.listed || ARRAY(SELECT o.other FROM herald.recipient_aliases_of($1, k.listed) o)
        AS all_names
    FROM keys k
)
SELECT t.id
FROM herald.tasks t, names n
WHERE t.namespace = $1 AND t.state = 'leased'
  AND herald.recipient_key(t.recipient) = ANY(n.all_names)
