-- A page of accounts ordered by id, after $3, optionally of one pool.
SELECT {account_columns}
FROM herald.accounts a
WHERE a.namespace = $1 AND ($2::text IS NULL OR a.pool = $2)
  AND ($3::text IS NULL OR a.id > $3)
ORDER BY a.id
LIMIT $4
