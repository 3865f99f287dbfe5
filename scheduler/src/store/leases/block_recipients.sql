-- Leaves recipients alone on the account of their task for the given milliseconds: the
-- provider throttled that recipient only (a recipient-scoped RATE_LIMITED). Pairs are keyed
-- by the recipient without a leading '+' (migration 35).
-- One row per pair, the longest block: two throttled tasks to one recipient on one account
-- in a batch would otherwise ask ON CONFLICT to update a row twice, which fails the whole
-- batch. In the pairs' order, so batches applied at once lock the marks in one order.
INSERT INTO herald.recipient_sends AS s
    (namespace, account_id, recipient, last_sent_at, blocked_until)
SELECT t.namespace, t.account_id, herald.recipient_key(t.recipient), herald.now(),
       herald.now() + max(b.ms) * interval '1 millisecond'
FROM unnest($1::uuid[], $2::bigint[]) AS b(id, ms)
JOIN herald.tasks t ON t.id = b.id
WHERE t.account_id IS NOT NULL
GROUP BY t.namespace, t.account_id, herald.recipient_key(t.recipient)
ORDER BY t.namespace, t.account_id, herald.recipient_key(t.recipient)
ON CONFLICT (namespace, account_id, recipient) DO UPDATE
SET blocked_until = greatest(COALESCE(s.blocked_until, herald.now()), EXCLUDED.blocked_until)
