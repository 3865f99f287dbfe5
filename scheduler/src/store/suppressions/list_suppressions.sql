-- One page of namespace $1's suppression list in recipient order, after recipient $2 (NULL:
-- from the start), optionally only reason $3; $4 rows.
SELECT recipient, reason::text AS reason, note, created_at
FROM herald.suppressions
WHERE namespace = $1
  AND ($2::text IS NULL OR recipient > $2)
  AND ($3::text IS NULL OR reason::text = $3)
ORDER BY recipient
LIMIT $4
