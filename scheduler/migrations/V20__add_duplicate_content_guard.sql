-- The duplicate content guard (a window per campaign, per task, or per queue in the scheduler's
-- configuration): one row per guarded task, keyed by what makes two messages the same — the
-- namespace, the recipient and the SHA-256 of the rendered content — with its due time. Only
-- guarded tasks have a row, so tasks without a window cost nothing. A pruned task takes its
-- row with it.
CREATE TABLE herald.content_guard (
    task_id      uuid PRIMARY KEY REFERENCES herald.tasks (id) ON DELETE CASCADE,
    namespace    text NOT NULL,
    recipient    text NOT NULL,
    content_hash bytea NOT NULL,
    run_at       timestamptz NOT NULL
);
CREATE INDEX content_guard_key ON herald.content_guard (namespace, recipient, content_hash, run_at);
