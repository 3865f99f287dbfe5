-- The provider's id of each reply (WhatsApp's messages[].id), so that a webhook delivered again
-- stores the reply once (record_inbound_message.sql). Replies stored before have none.
ALTER TABLE herald.inbound_messages ADD COLUMN provider_message_id text;
CREATE UNIQUE INDEX inbound_messages_provider_id ON herald.inbound_messages
    (namespace, provider_message_id) WHERE provider_message_id IS NOT NULL;
