-- Every account of a namespace with what it may send now (see herald.account_room).
SELECT a.id, a.pool, a.credentials_ref, a.recipient_interval_ms, a.high_priority_min,
       r.room, r.room_low,
       -- How long until time alone gives room again, by the database's clock (the dispatcher
       -- sleeps that long; it has no clock of its own to compare an instant with).
       (extract(epoch FROM r.available_at - herald.now()) * 1000.0)::float8 AS available_in_ms
FROM herald.accounts a
CROSS JOIN LATERAL herald.account_room(a, herald.now()) r
WHERE a.namespace = $1
ORDER BY a.id
