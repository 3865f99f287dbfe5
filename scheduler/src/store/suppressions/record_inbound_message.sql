-- Stores one reply: sender $3 wrote to the account known as credentials_ref $2 of namespace $1 a message of type $4 with
-- text $5 (NULL for media) at $6 (NULL: now).
INSERT INTO herald.inbound_messages (namespace, credentials_ref, sender, kind, body, received_at)
VALUES ($1, $2, $3, $4, $5, COALESCE($6, herald.now()))
