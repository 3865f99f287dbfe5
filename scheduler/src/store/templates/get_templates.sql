-- The templates among $2 that exist.
SELECT {template_columns} FROM herald.templates WHERE namespace = $1 AND id = ANY($2)
