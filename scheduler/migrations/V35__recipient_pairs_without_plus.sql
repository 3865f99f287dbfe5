-- Recipient pairs are keyed by the recipient without its leading '+' from now on, as the
-- suppression list compares them (rules::recipient_key): WhatsApp reports a sender as digits
-- alone, so a reply to '+1650…' opened the window of another pair than the one its sends were
-- counted under, and a number spelled both ways escaped its own spacing. The pairs written
-- with a '+' are folded into their key, keeping the later of each instant.
INSERT INTO herald.recipient_sends AS s
    (namespace, account_id, recipient, last_sent_at, blocked_until, opened_at, inbound_at)
SELECT namespace, account_id, ltrim(recipient, '+'), max(last_sent_at), max(blocked_until),
       max(opened_at), max(inbound_at)
FROM herald.recipient_sends
WHERE recipient LIKE '+%'
GROUP BY namespace, account_id, ltrim(recipient, '+')
ON CONFLICT (namespace, recipient, account_id) DO UPDATE
SET last_sent_at = greatest(s.last_sent_at, EXCLUDED.last_sent_at),
    blocked_until = greatest(s.blocked_until, EXCLUDED.blocked_until),
    opened_at = greatest(s.opened_at, EXCLUDED.opened_at),
    inbound_at = greatest(s.inbound_at, EXCLUDED.inbound_at);
DELETE FROM herald.recipient_sends WHERE recipient LIKE '+%';
