-- Moves a schedule's cursor past what was materialised, in the transaction that created it.
UPDATE herald.schedules SET next_fire_at = $3, last_fire_at = $4
WHERE namespace = $1 AND id = $2
