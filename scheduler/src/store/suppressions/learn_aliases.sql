-- Records the names status callbacks gave the recipients of their tasks ($2 the tasks, $3 the
-- provider's names; namespace $1) where they differ from the name the task used (migration 36).
-- Most callbacks name the recipient as the task did and record nothing. Returns both names of
-- each pair newly learned, for herald.cover_aliases.
INSERT INTO herald.recipient_aliases (namespace, recipient, alias)
SELECT DISTINCT $1, herald.recipient_key(t.recipient), herald.recipient_key(n.alias)
FROM unnest($2::uuid[], $3::text[]) AS n(task_id, alias)
JOIN herald.task_records t ON t.id = n.task_id AND t.namespace = $1
WHERE herald.recipient_key(t.recipient) <> herald.recipient_key(n.alias)
ON CONFLICT DO NOTHING
RETURNING recipient, alias
