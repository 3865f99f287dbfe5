-- Moves SCHEDULED tasks (a bulk reschedule's batch, already locked) to $3, or by $4 ms;
-- returns the new due times. Fenced on the state as UpdateTask is; compared as text, so the plan
-- stays a primary-key probe per id (see store/leases/extend_leases.sql).
UPDATE herald.tasks t
SET run_at = coalesce($3::timestamptz, t.run_at + $4::bigint * interval '1 millisecond'),
    updated_at = herald.now()
WHERE t.id = ANY($1) AND t.namespace = $2 AND t.state::text = 'scheduled'
RETURNING t.run_at
