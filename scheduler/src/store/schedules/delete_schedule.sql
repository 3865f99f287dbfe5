-- Deletes a schedule; its runs go with it (ON DELETE CASCADE).
DELETE FROM herald.schedules WHERE namespace = $1 AND id = $2
