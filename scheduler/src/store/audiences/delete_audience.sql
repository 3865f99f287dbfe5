-- Deletes an audience; its contacts go with it (ON DELETE CASCADE).
DELETE FROM herald.audiences WHERE namespace = $1 AND id = $2
