-- Forgets up to $2 (account, recipient) pairs nothing depends on any more: last sent to more
-- than $1 ms ago (the task retention: how long a sticky pool remembers a recipient's account)
-- and longer ago than the account's recipient interval, no provider block in force, and no
-- conversation or customer-service window opened in the last 24 hours (the messaging tier).
-- A pair only ever written by an inbound message has last_sent_at -infinity. The age index
-- (recipient_sends_age) finds the candidates; SKIP LOCKED leaves pairs a claim is marking.
WITH old AS (
    SELECT s.namespace, s.account_id, s.recipient
    FROM herald.recipient_sends s
    LEFT JOIN herald.accounts a ON a.namespace = s.namespace AND a.id = s.account_id
    WHERE s.last_sent_at < herald.now() - $1::bigint * interval '1 millisecond'
      AND s.last_sent_at < herald.now()
                           - coalesce(a.recipient_interval_ms, 0) * interval '1 millisecond'
      AND (s.blocked_until IS NULL OR s.blocked_until <= herald.now())
      AND (s.opened_at IS NULL OR s.opened_at <= herald.now() - interval '24 hours')
      AND (s.inbound_at IS NULL OR s.inbound_at <= herald.now() - interval '24 hours')
    LIMIT $2::bigint
    FOR UPDATE OF s SKIP LOCKED
)
DELETE FROM herald.recipient_sends s
USING old
WHERE s.namespace = old.namespace AND s.account_id = old.account_id
  AND s.recipient = old.recipient
