-- Records that recipient $3 wrote to account $2 at $4: a customer-service window is open for
-- 24 hours after it, during which sends to the recipient through the account do not count
-- against its messaging tier. Keeps the latest time when messages arrive out of order. No row
-- when the account does not exist. A pair without sends gets last_sent_at '-infinity', which
-- every spacing rule reads as "never sent". A time after now (a caller's or a provider's clock
-- ahead of the database's, or a wrong value) counts as now: it would otherwise keep the window
-- open, and the recipient free of the tier, until then. Pairs are keyed by the recipient
-- without a leading '+' (migration 35): WhatsApp names a sender by its digits alone.
INSERT INTO herald.recipient_sends AS s (namespace, account_id, recipient, last_sent_at,
                                         inbound_at)
SELECT a.namespace, a.id, herald.recipient_key($3), '-infinity',
       least(COALESCE($4, herald.now()), herald.now())
FROM herald.accounts a
WHERE a.namespace = $1 AND a.id = $2
ON CONFLICT (namespace, account_id, recipient) DO UPDATE
SET inbound_at = greatest(s.inbound_at, EXCLUDED.inbound_at)
RETURNING s.inbound_at + interval '24 hours' AS window_until
