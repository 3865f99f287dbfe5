-- Milliseconds until the next lease expiry or deadline, on the database clock; NULL if none.
-- Lease expiries are looked for from $1, where the next sweep starts (expire_leases.sql).
SELECT (extract(epoch FROM (least(
    (SELECT min(lease_expires_at) FROM herald.tasks
     WHERE state = 'leased' AND lease_expires_at >= coalesce($1::timestamptz, '-infinity')),
    (SELECT min(expire_at) FROM herald.tasks WHERE state = 'scheduled' AND expire_at IS NOT NULL)
) - herald.now())) * 1000.0)::float8 AS wait_ms
