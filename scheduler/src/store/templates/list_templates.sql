-- Every template of the namespace, ordered by id.
SELECT {template_columns} FROM herald.templates WHERE namespace = $1 ORDER BY id
