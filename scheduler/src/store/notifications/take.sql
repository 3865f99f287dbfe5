-- Takes up to $1 due notifications for delivery, pushing their next try $2 ms ahead so no other
-- replica sends them meanwhile (and a crash mid-delivery only delays them).
UPDATE herald.notifications n
SET attempts = n.attempts + 1,
    next_attempt_at = now() + $2::bigint * interval '1 millisecond'
FROM (SELECT id FROM herald.notifications
      WHERE next_attempt_at <= now()
      ORDER BY next_attempt_at LIMIT $1
      FOR UPDATE SKIP LOCKED) due
WHERE n.id = due.id
RETURNING n.id, n.event, n.payload, n.attempts
