-- Audiences with an id after $2, by id.
SELECT {audience_columns} FROM herald.audiences
WHERE namespace = $1 AND id > $2
ORDER BY id
LIMIT $3
