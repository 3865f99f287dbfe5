-- Stores a new template. The parameters are those of update_template.sql.
INSERT INTO herald.templates (namespace, id, description, kind, body, provider_name,
                              provider_language, parameters, variables, provider_components,
                              window_closed_fallback)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
RETURNING {template_columns}
