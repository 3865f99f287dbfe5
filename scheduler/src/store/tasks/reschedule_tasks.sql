-- Moves SCHEDULED tasks (a bulk reschedule's batch, already locked) to $3, or by $4 ms;
-- returns the new due times. Fenced on the state as UpdateTask is; compared as text, so the plan
-- stays a primary-key probe per id (see store/leases/extend_leases.sql). A task the move would
-- put at or past its expiry (it would end EXPIRED unsent), or more than 366 days ahead (which
-- CreateTask and UpdateTask refuse), stays where it is and is not counted as changed.
UPDATE herald.tasks t
SET run_at = m.run_at,
    updated_at = herald.now()
FROM (SELECT t0.id,
             coalesce($3::timestamptz, t0.run_at + $4::bigint * interval '1 millisecond') AS run_at
      FROM herald.tasks t0
      WHERE t0.id = ANY($1) AND t0.namespace = $2) m
WHERE t.id = m.id AND t.namespace = $2 AND t.state::text = 'scheduled'
  AND (t.expire_at IS NULL OR m.run_at < t.expire_at)
  AND m.run_at <= herald.now() + interval '366 days'
RETURNING t.run_at
