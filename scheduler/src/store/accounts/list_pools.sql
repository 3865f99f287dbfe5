-- Pools (all, or the one named) with their members and combined status.
SELECT p.name, p.description, p.created_at, p.sticky,
       COALESCE(array_agg(a.id ORDER BY a.id) FILTER (WHERE a.id IS NOT NULL), '{}')
           AS account_ids,
       COALESCE(sum(a.effective_rate) FILTER (WHERE a.state = 'active'), 0) AS effective_rate,
       (SELECT count(*) FROM herald.tasks t
        WHERE t.state = 'scheduled' AND t.route = p.namespace || '/p:' || p.name)
           AS scheduled_tasks
FROM herald.pools p
LEFT JOIN herald.accounts a ON a.namespace = p.namespace AND a.pool = p.name
WHERE p.namespace = $1 AND ($2::text IS NULL OR p.name = $2)
GROUP BY p.namespace, p.name, p.description, p.created_at, p.sticky
ORDER BY p.name
