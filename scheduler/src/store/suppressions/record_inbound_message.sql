-- Stores one reply: sender $3 wrote to the account known as credentials_ref $2 of namespace $1 a message of type $4 with
-- text $5 (NULL for media) at $6 (NULL: now). A message the provider named ($7) is stored once:
-- a webhook delivered again (Meta redelivers until answered 200) stores nothing more.
INSERT INTO herald.inbound_messages (namespace, credentials_ref, sender, kind, body, received_at,
                                     provider_message_id)
VALUES ($1, $2, $3, $4, $5, COALESCE($6, herald.now()), $7)
ON CONFLICT (namespace, provider_message_id) WHERE provider_message_id IS NOT NULL DO NOTHING
