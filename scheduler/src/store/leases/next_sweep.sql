-- Milliseconds until the next lease expiry or deadline within $2 ms, on the database clock;
-- NULL if none (the sweeper sleeps at most $2 ms anyway). Lease expiries are looked for from
-- $1, where the next sweep starts (expire_leases.sql). The horizon bounds the walk: the index
-- also holds entries of leases reported before they expired, which a snapshot another session
-- holds keeps there, a lease TTL's worth of them ahead of the clock.
SELECT (extract(epoch FROM (least(
    (SELECT min(lease_expires_at) FROM herald.tasks
     WHERE state = 'leased' AND lease_expires_at >= coalesce($1::timestamptz, '-infinity')
       AND lease_expires_at <= herald.now() + $2::bigint * interval '1 millisecond'),
    (SELECT min(expire_at) FROM herald.tasks
     WHERE state = 'scheduled' AND expire_at IS NOT NULL
       AND expire_at <= herald.now() + $2::bigint * interval '1 millisecond')
) - herald.now())) * 1000.0)::float8 AS wait_ms
