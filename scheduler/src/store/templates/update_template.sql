-- Replaces a template's kind and description. The parameters are those of insert_template.sql.
UPDATE herald.templates SET description = $3, kind = $4, body = $5, provider_name = $6,
                            provider_language = $7, parameters = $8, variables = $9,
                            provider_components = $10, window_closed_fallback = $11,
                            updated_at = herald.now()
WHERE namespace = $1 AND id = $2
RETURNING {template_columns}
