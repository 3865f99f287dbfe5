-- Due tasks that a routed claim may lease, locked for this transaction: up to $3 of each route in
-- $2 (the queue-routed route and the pools, probed once per priority level so future tasks are
-- never visited) and up to $5 of each pinned-account route in $4 (walked in priority order:
-- pinned tasks are few). The caller assigns accounts and leases some; the rest stay scheduled
-- when the transaction ends.
SELECT c.id, c.route, c.recipient, c.priority, c.run_at
FROM (
    SELECT x.*
    FROM unnest($2::text[], $3::integer[]) AS r(route, lim)
    CROSS JOIN LATERAL (
        SELECT y.*
        FROM unnest($1::smallint[]) AS p(priority)
        CROSS JOIN LATERAL (
            SELECT t.id, t.route, t.recipient, t.priority, t.run_at
            FROM herald.tasks t
            WHERE t.state = 'scheduled'
              AND t.route = r.route
              AND t.priority = p.priority
              AND t.run_at <= now()
              AND (t.expire_at IS NULL OR t.expire_at > now())
              AND ($6::text[] IS NULL OR t.queue = ANY($6::text[]))
            ORDER BY t.run_at
            LIMIT r.lim
            FOR UPDATE SKIP LOCKED
        ) y
        LIMIT r.lim
    ) x
    UNION ALL
    SELECT z.*
    FROM unnest($4::text[], $5::integer[]) AS r(route, lim)
    CROSS JOIN LATERAL (
        SELECT t.id, t.route, t.recipient, t.priority, t.run_at
        FROM herald.tasks t
        WHERE t.state = 'scheduled'
          AND t.route = r.route
          AND t.run_at <= now()
          AND (t.expire_at IS NULL OR t.expire_at > now())
          AND ($6::text[] IS NULL OR t.queue = ANY($6::text[]))
        ORDER BY t.priority DESC, t.run_at
        LIMIT r.lim
        FOR UPDATE SKIP LOCKED
    ) z
) c
ORDER BY c.priority DESC, c.run_at
