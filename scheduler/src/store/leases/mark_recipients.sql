-- Records sends to recipients on accounts that track them (spacing, the messaging tier, sticky
-- pools) at the given instants (the reservations' times), atomically: a row whose last send is
-- too recent (or which the provider blocked) is not updated and not returned, and the caller
-- drops that task. A concurrent claim inserting the same pair waits for ours to commit, then
-- finds the fresh row and is refused the same way. $5 says which sends open a
-- business-initiated conversation (counted against the tier for 24 hours from then).
INSERT INTO herald.recipient_sends AS s (namespace, account_id, recipient, last_sent_at,
                                         opened_at)
SELECT $1, m.account_id, m.recipient, m.at, CASE WHEN m.opens THEN m.at END
FROM unnest($2::text[], $3::text[], $4::timestamptz[], $5::boolean[])
    AS m(account_id, recipient, at, opens)
ON CONFLICT (namespace, account_id, recipient) DO UPDATE
SET last_sent_at = EXCLUDED.last_sent_at,
    opened_at = COALESCE(EXCLUDED.opened_at, s.opened_at)
WHERE (s.blocked_until IS NULL OR s.blocked_until <= EXCLUDED.last_sent_at)
  AND s.last_sent_at <= EXCLUDED.last_sent_at - COALESCE(
        (SELECT a.recipient_interval_ms FROM herald.accounts a
         WHERE a.namespace = s.namespace AND a.id = s.account_id), 0)
      * interval '1 millisecond'
RETURNING s.account_id, s.recipient
