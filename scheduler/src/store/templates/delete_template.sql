-- Deletes a template.
DELETE FROM herald.templates WHERE namespace = $1 AND id = $2
