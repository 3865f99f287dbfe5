-- One audience.
SELECT {audience_columns} FROM herald.audiences WHERE namespace = $1 AND id = $2
