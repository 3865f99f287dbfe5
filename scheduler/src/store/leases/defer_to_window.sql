-- Moves locked candidates whose send window is closed to its next opening (the claim computed
-- when: herald.window_defer_to). = ANY($1) pins the update to primary-key lookups.
UPDATE herald.tasks t
SET run_at = d.at, updated_at = herald.now()
FROM unnest($1::uuid[], $2::timestamptz[]) AS d(id, at)
WHERE t.id = ANY($1::uuid[]) AND t.id = d.id AND t.state = 'scheduled'
