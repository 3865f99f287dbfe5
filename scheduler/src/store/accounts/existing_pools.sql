-- Which of the named pools exist.
SELECT name FROM herald.pools WHERE namespace = $1 AND name = ANY($2)
