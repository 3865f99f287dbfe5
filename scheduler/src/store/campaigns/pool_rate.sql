-- The sum of a pool's active accounts' effective rates, per second.
SELECT coalesce(sum(effective_rate), 0)::float8 AS rate FROM herald.accounts
WHERE namespace = $1 AND pool = $2 AND state = 'active'
