-- Another name a provider knows a recipient by: WhatsApp's status callbacks and replies name a
-- user by their WhatsApp id (wa_id), which "may not always match" the number a message was
-- sent to (Brazilian and Mexican numbers, for instance, gain or lose a digit). A STOP from the
-- wa_id must still stop messages to the number: a suppression of either name covers the other
-- (herald.cover_aliases). Learned from status callbacks that name their task, both names as
-- herald.recipient_key has them; kept for good, as the suppression list is.
CREATE TABLE herald.recipient_aliases (
    namespace  text NOT NULL,
    -- The recipient as the task named it.
    recipient  text NOT NULL,
    -- The provider's name for them.
    alias      text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, recipient, alias)
);
CREATE INDEX recipient_aliases_by_alias ON herald.recipient_aliases (namespace, alias);
