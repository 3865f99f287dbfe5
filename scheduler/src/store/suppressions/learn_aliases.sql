-- Records the names status callbacks gave the recipients of their tasks ($2 the tasks, $3 the
-- provider's names; namespace $1) where they differ from the name the task used (migration 36).
-- Most callbacks name the recipient as the task did and record nothing. Returns both names of
-- every differing pair named, new or known, for herald.cover_aliases: a suppression listed
-- while the pair was being learned by another transaction is then covered by the next
-- callback naming the pair.
WITH named AS (
    SELECT DISTINCT herald.recipient_key(t.recipient) AS recipient,
           herald.recipient_key(n.alias) AS alias
    FROM unnest($2::uuid[], $3::text[]) AS n(task_id, alias)
    JOIN herald.task_records t ON t.id = n.task_id AND t.namespace = $1
    WHERE herald.recipient_key(t.recipient) <> herald.recipient_key(n.alias)
),
learned AS (
    INSERT INTO herald.recipient_aliases (namespace, recipient, alias)
    SELECT $1, n.recipient, n.alias FROM named n
    ON CONFLICT DO NOTHING
)
SELECT recipient, alias FROM named
