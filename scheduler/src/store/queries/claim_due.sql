-- Leases up to $3 due tasks of the queue-routed route $6 ('<namespace>/'), highest priority
-- first, then earliest due: the fast path when the namespace has no accounts.
-- The lateral subquery runs once per priority level ($1, highest first) and walks the
-- (route, priority, run_at) index from the oldest due task, so tasks scheduled for the future
-- are never visited however many there are. SKIP LOCKED lets every replica and session claim at
-- once without handing a task out twice. now() is the database clock: nothing is leased early.
WITH due AS (
    SELECT c.id
    FROM unnest($1::smallint[]) AS p(priority)
    CROSS JOIN LATERAL (
        SELECT t.id
        FROM herald.tasks t
        WHERE t.state = 'scheduled'
          AND t.route = $6
          AND t.priority = p.priority
          AND t.run_at <= now()
          -- Past its deadline: the sweeper marks it EXPIRED; never send it late.
          AND (t.expire_at IS NULL OR t.expire_at > now())
          AND ($2::text[] IS NULL OR t.queue = ANY($2::text[]))
        ORDER BY t.run_at
        LIMIT $3
        FOR UPDATE SKIP LOCKED
    ) c
    LIMIT $3
)
UPDATE herald.tasks t
SET state = 'leased',
    lease_count = t.lease_count + 1,
    executor_id = $4,
    leased_at = now(),
    lease_expires_at = now() + $5::bigint * interval '1 millisecond',
    updated_at = now()
FROM due
WHERE t.id = due.id
RETURNING t.id, t.lease_count, t.queue, t.recipient, t.content,
          COALESCE(t.idempotency_key, t.id::text), t.run_at, t.leased_at, t.lease_expires_at,
          t.attempts, t.max_attempts, t.labels, NULL::text, NULL::text,
          t.trace_parent
