-- Message templates, rendered into a task's content when the task is created.
CREATE TABLE herald.templates (
    namespace   text NOT NULL,
    id          text NOT NULL,
    description text NOT NULL DEFAULT '',
    -- 'text' (body rendered by herald) or 'provider' (mapped onto a provider's template).
    kind        text NOT NULL CHECK (kind IN ('text', 'provider')),
    body        text,
    provider_name     text,
    provider_language text,
    parameters  text[] NOT NULL DEFAULT '{}',
    variables   text[] NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, id)
);
