-- Every account of a namespace with what it may send now (see herald.account_room).
SELECT a.id, a.pool, a.credentials_ref, a.recipient_interval_ms, a.high_priority_min,
       r.room, r.room_low, r.available_at
FROM herald.accounts a
CROSS JOIN LATERAL herald.account_room(a, now()) r
WHERE a.namespace = $1
ORDER BY a.id
