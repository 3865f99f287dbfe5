-- Records a failed delivery and when to try again ($2 ms from now).
UPDATE herald.notifications
SET next_attempt_at = now() + $2::bigint * interval '1 millisecond', last_error = $3
WHERE id = $1
