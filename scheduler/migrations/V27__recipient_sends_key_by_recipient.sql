-- One index where there were two: recipient_sends was keyed (namespace, account_id, recipient)
-- and also indexed (namespace, recipient) for the claim's look-up of what the accounts know of
-- a recipient (recipient_facts.sql). Keyed (namespace, recipient, account_id), the primary key
-- serves that look-up and every exact match (the grant's recipient marks, ON CONFLICT on the
-- three columns, retention's deletes), and each new pair and each send to a known one writes
-- one index entry fewer. The tier's count per account has its own index
-- (recipient_sends_opened). The new key is built under the table's lock: on millions of pairs
-- the claims of routed tasks wait for it (seconds) while the upgrade runs.
ALTER TABLE herald.recipient_sends
    DROP CONSTRAINT recipient_sends_pkey,
    ADD CONSTRAINT recipient_sends_pkey PRIMARY KEY (namespace, recipient, account_id);
DROP INDEX herald.recipient_sends_recipient;
