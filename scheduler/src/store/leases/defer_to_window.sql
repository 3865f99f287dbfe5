-- Moves locked candidates with a send window that is closed now to its next opening
-- (herald.window_defer_to) and returns them; the rest of $1 are inside their windows.
-- = ANY($1) pins the update to primary-key lookups, and the state compared as text keeps
-- partial indexes on the state out of the plan (see extend_leases.sql).
UPDATE herald.tasks t
SET run_at = herald.window_defer_to(t.id, t.window_start, t.window_end, t.window_zone,
                                    t.window_spread_ms, herald.now()),
    updated_at = herald.now()
WHERE t.id = ANY($1::uuid[]) AND t.state::text = 'scheduled'
  AND herald.window_defer_to(t.id, t.window_start, t.window_end, t.window_zone,
                             t.window_spread_ms, herald.now()) IS NOT NULL
RETURNING t.id
