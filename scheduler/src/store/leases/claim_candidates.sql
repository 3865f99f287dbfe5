-- Due tasks that a routed claim may lease, locked for this transaction: up to $2 of each route in
-- $1 (the queue-routed route and the pools, probed once per priority level so future tasks are
-- never visited: the placeholder below becomes claim_candidates.at_priority.sql once per level,
-- highest first) and up to $4 of each pinned-account route in $3 (walked in priority order:
-- pinned tasks are few). The caller assigns accounts and leases some; the rest stay scheduled
-- when the transaction ends.
-- `suppressed`: the recipient is on the namespace ($6) suppression list (migration 15); the
-- caller ends such a task instead of routing it. One primary-key probe per candidate.
SELECT c.id, c.route, c.recipient, c.priority, c.queue, c.run_at, c.windowed,
       EXISTS (SELECT 1 FROM herald.suppressions s
               WHERE s.namespace = $6 AND s.recipient = herald.recipient_key(c.recipient)) AS suppressed
FROM (
    SELECT x.*
    FROM unnest($1::text[], $2::integer[]) AS r(route, lim)
    CROSS JOIN LATERAL (
        {at_each_priority}
        LIMIT r.lim
    ) x
    UNION ALL
    SELECT z.*
    FROM unnest($3::text[], $4::integer[]) AS r(route, lim)
    CROSS JOIN LATERAL (
        SELECT t.id, t.route, t.recipient, t.priority, t.queue, t.run_at,
               t.window_start IS NOT NULL AS windowed
        FROM herald.tasks t
        WHERE t.state = 'scheduled'
          AND t.route = r.route
          AND t.run_at <= herald.now()
          AND (t.expire_at IS NULL OR t.expire_at > herald.now())
          AND ($5::text[] IS NULL OR t.queue = ANY($5::text[]))
        ORDER BY t.priority DESC, t.run_at
        LIMIT r.lim
        FOR UPDATE SKIP LOCKED
    ) z
) c
ORDER BY c.priority DESC, c.run_at
