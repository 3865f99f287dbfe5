-- Hands leases back without charging an attempt: they never reached an executor. Returns the
-- account of each, as '<namespace>/<account>', whose slot (and daily count) the caller frees in
-- the same transaction.
UPDATE herald.tasks t
SET state = 'scheduled', lease_expires_at = NULL, updated_at = herald.now()
FROM unnest(herald.opaque_to_planner($1::uuid[]), herald.opaque_to_planner($2::integer[]))
    AS l(id, attempt)
-- One primary-key probe per lease, whatever the statistics say (see extend_leases.sql).
WHERE t.id = l.id AND t.lease_count = l.attempt
  AND t.state::text = 'leased' AND t.namespace = $3
RETURNING t.namespace || '/' || t.account_id AS account
