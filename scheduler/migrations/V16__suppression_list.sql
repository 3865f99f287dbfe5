-- The namespace-wide suppression list (#16 item 2, #15 item 6): recipients herald must not
-- message. A task to a listed recipient ends CANCELLED with end reason 'suppressed' when it is
-- created, or when a claim finds it due (the recipient was listed after it was queued): never
-- sent, never silently dropped.
CREATE TYPE herald.suppression_reason AS ENUM (
    -- The recipient replied with an opt-out keyword (STOP, UNSUBSCRIBE, 退订, ...).
    'opt_out',
    -- The number or user id cannot receive messages.
    'invalid_recipient',
    -- Added by an operator or a client.
    'manual'
);

CREATE TABLE herald.suppressions (
    namespace  text NOT NULL,
    -- As tasks name it, with a leading '+' dropped (WhatsApp reports senders without it), so
    -- "+16505550011" and "16505550011" are one entry. Claims probe this key for every due task.
    recipient  text NOT NULL,
    reason     herald.suppression_reason NOT NULL,
    -- Free text: who added it and why, or the opt-out message.
    note       text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, recipient)
);

-- Replies recipients sent to an account (WhatsApp `messages[]`), kept minimally: who wrote to
-- which account, the message type and its text when it had one.
CREATE TABLE herald.inbound_messages (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    namespace   text NOT NULL,
    -- The account written to, as executors know it (its credentials_ref).
    credentials_ref text NOT NULL,
    sender      text NOT NULL,
    -- The provider's message type ("text", "button", "image", ...).
    kind        text NOT NULL,
    -- The text of a text message, or the payload of a button reply; NULL for media.
    body        text,
    received_at timestamptz NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX inbound_messages_sender ON herald.inbound_messages (namespace, sender, received_at);
-- Retention prunes by age.
CREATE INDEX inbound_messages_recorded ON herald.inbound_messages (recorded_at);
