-- A page of the namespace's templates ordered by id, after $2, at most $3.
SELECT {template_columns} FROM herald.templates
WHERE namespace = $1 AND ($2::text IS NULL OR id > $2)
ORDER BY id
LIMIT $3
