-- Records sends to recipients on accounts with a minimum interval, atomically: a row whose last
-- send is too recent (or which the provider blocked) is not updated and not returned, and the
-- caller drops that task. A concurrent claim inserting the same pair waits for ours to commit,
-- then finds the fresh row and is refused the same way.
INSERT INTO herald.recipient_sends AS s (namespace, account_id, recipient, last_sent_at)
SELECT $1, m.account_id, m.recipient, now()
FROM unnest($2::text[], $3::text[]) AS m(account_id, recipient)
ON CONFLICT (namespace, account_id, recipient) DO UPDATE
SET last_sent_at = now()
WHERE (s.blocked_until IS NULL OR s.blocked_until <= now())
  AND s.last_sent_at <= now() - COALESCE(
        (SELECT a.recipient_interval_ms FROM herald.accounts a
         WHERE a.namespace = s.namespace AND a.id = s.account_id), 0)
      * interval '1 millisecond'
RETURNING s.account_id, s.recipient
