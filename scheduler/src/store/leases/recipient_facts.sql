-- What the namespace's accounts know of the candidates' recipients, one row per (account,
-- recipient) pair seen before: whether it may not be sent to now (the provider asked us to
-- leave the recipient alone, or it was sent to within the account's interval), whether a send
-- now is free of the messaging tier (a conversation opened in the last 24 hours, or the
-- recipient wrote in the last 24 hours), and when it was last sent to (sticky routing). One
-- probe of the primary key (namespace, recipient, account_id) per recipient, forced by LATERAL:
-- left to itself the planner walked every pair of the namespace (migration 27 has the key).
-- Pairs are keyed by the recipient without a leading '+' (migration 35); each row names the
-- recipient as the candidates spelled it.
SELECT s.account_id, r.recipient,
       (s.blocked_until > herald.now()
        OR s.last_sent_at > herald.now() - COALESCE(a.recipient_interval_ms, 0)
                                         * interval '1 millisecond') AS blocked,
       (s.opened_at > herald.now() - interval '24 hours'
        OR s.inbound_at > herald.now() - interval '24 hours') AS tier_free,
       -- NULL for a pair never sent to (only an inbound message recorded).
       CASE WHEN isfinite(s.last_sent_at) THEN s.last_sent_at END AS last_sent_at
FROM unnest($2::text[]) AS r(recipient)
CROSS JOIN LATERAL (
    SELECT * FROM herald.recipient_sends s
    WHERE s.namespace = $1 AND s.recipient = herald.recipient_key(r.recipient)
    -- Keeps the subquery from being flattened into the join.
    OFFSET 0
) s
JOIN herald.accounts a ON a.namespace = s.namespace AND a.id = s.account_id
