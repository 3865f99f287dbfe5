-- Pushes the expiry of still-held leases one TTL from now; a lease no longer current (expired
-- and re-leased, or cancelled) matches nothing and is reported lost by the caller.
UPDATE herald.tasks t
SET lease_expires_at = herald.now() + $3::bigint * interval '1 millisecond',
    updated_at = herald.now()
FROM unnest($1::uuid[], $2::integer[]) AS l(id, attempt)
-- = ANY($1) pins the update to primary-key lookups: joined on id alone, a batch of hundreds
-- may be planned as a hash join over a sequential scan of the whole table.
WHERE t.id = ANY($1::uuid[]) AND t.id = l.id AND t.lease_count = l.attempt
  AND t.state = 'leased' AND t.namespace = $4
RETURNING t.id AS task_id, t.lease_count AS attempt, t.lease_expires_at AS expires_at
