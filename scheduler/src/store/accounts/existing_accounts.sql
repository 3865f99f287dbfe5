-- Which of the named accounts exist.
SELECT id FROM herald.accounts WHERE namespace = $1 AND id = ANY($2)
