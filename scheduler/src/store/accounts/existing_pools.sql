-- Which of the named pools exist, with the sender kinds of their accounts (a task for the
-- pool may go out through any of them, so its content must suit them all).
SELECT p.name,
       COALESCE(array_agg(DISTINCT a.sender_kind) FILTER (WHERE a.id IS NOT NULL), '{}') AS kinds
FROM herald.pools p
LEFT JOIN herald.accounts a ON a.namespace = p.namespace AND a.pool = p.name
WHERE p.namespace = $1 AND p.name = ANY($2)
GROUP BY p.name
