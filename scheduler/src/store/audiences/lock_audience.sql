-- One audience, locked for a contact write: writers of one audience take turns on its
-- contact count, so the 1,000,000 bound holds under concurrent imports.
SELECT {audience_columns} FROM herald.audiences WHERE namespace = $1 AND id = $2
FOR UPDATE
