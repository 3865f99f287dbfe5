-- The window-closed fallback (#15 item 3): a WhatsApp task may name an approved template to send
-- instead, once, when WhatsApp refuses or fails its message with 131047 (the recipient's
-- 24-hour customer-service window is closed). docs/api.md#the-window-closed-fallback.
ALTER TABLE herald.tasks
    -- herald.v1.Content holding the template, prost-encoded like `content`; NULL: no fallback.
    ADD COLUMN window_closed_fallback bytea,
    -- When the fallback took the place of `content` (refused at send time, or failed after
    -- acceptance). Set once and never cleared: from then on every lease sends the fallback and
    -- none carries it as a fallback, so it can never be triggered, and sent, a second time.
    ADD COLUMN window_closed_fallback_at timestamptz,
    -- The provider message id of the message the fallback replaced after it was accepted (the
    -- late path); NULL when the send itself was refused. That message's reports stay on the
    -- task but no longer make its delivery, nor end it, nor settle an unknown outcome.
    ADD COLUMN fallback_replaces text;

ALTER TABLE herald.templates
    -- The fallback of the tasks whose content names this template and that have none of their
    -- own: a herald.v1.TemplateContent, prost-encoded; NULL: none.
    ADD COLUMN window_closed_fallback bytea;

ALTER TABLE herald.attempts
    -- This attempt's send was refused with 131047 and it sent the fallback instead.
    ADD COLUMN window_closed_fallback boolean NOT NULL DEFAULT false;
