-- Every account of a namespace with what it may send now (see herald.account_room), and what
-- routing weighs: its health, whether its pool is sticky, and whether its sends are recorded
-- per recipient (spacing, the messaging tier or a sticky pool need them).
SELECT a.id, a.pool, a.credentials_ref, a.recipient_interval_ms, a.high_priority_min,
       r.room, r.room_low, r.tier_room, a.tier_limit IS NOT NULL AS has_tier,
       a.state = 'active' OR r.reopen AS active,
       herald.account_health(a) AS health, p.sticky,
       -- How long until time alone gives room again, by the database's clock (the dispatcher
       -- sleeps that long; it has no clock of its own to compare an instant with).
       (extract(epoch FROM r.available_at - herald.now()) * 1000.0)::float8 AS available_in_ms
FROM herald.accounts a
JOIN herald.pools p ON p.namespace = a.namespace AND p.name = a.pool
CROSS JOIN LATERAL herald.account_room(a, herald.now()) r
WHERE a.namespace = $1
ORDER BY a.id
