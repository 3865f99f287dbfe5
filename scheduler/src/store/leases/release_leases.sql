-- Hands leases back without charging an attempt: they never reached an executor. Returns the
-- account of each, as '<namespace>/<account>', whose slot (and daily count) the caller frees in
-- the same transaction.
UPDATE herald.tasks t
SET state = 'scheduled', lease_expires_at = NULL, updated_at = herald.now()
FROM unnest($1::uuid[], $2::integer[]) AS l(id, attempt)
WHERE t.id = ANY($1::uuid[]) AND t.id = l.id AND t.lease_count = l.attempt
  AND t.state = 'leased' AND t.namespace = $3
RETURNING t.namespace || '/' || t.account_id AS account
