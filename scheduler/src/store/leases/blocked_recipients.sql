-- (account, recipient) pairs of the namespace that may not be sent to now: the provider asked
-- us to leave the recipient alone, or it was sent to within the account's interval. One probe
-- of recipient_sends_recipient per recipient, forced by LATERAL: left to itself the planner
-- walked every account's pairs through the primary key.
SELECT s.account_id, s.recipient
FROM unnest($2::text[]) AS r(recipient)
CROSS JOIN LATERAL (
    SELECT * FROM herald.recipient_sends s
    WHERE s.namespace = $1 AND s.recipient = r.recipient
    -- Keeps the subquery from being flattened into the join.
    OFFSET 0
) s
JOIN herald.accounts a ON a.namespace = s.namespace AND a.id = s.account_id
WHERE (s.blocked_until > herald.now()
       OR s.last_sent_at > herald.now() - COALESCE(a.recipient_interval_ms, 0)
                                   * interval '1 millisecond')
