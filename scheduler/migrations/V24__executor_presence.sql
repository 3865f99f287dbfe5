-- Which executors are connected, to any replica, with the queues they serve and the accounts'
-- credentials they hold: the console says "no executor connected for its queue" from it. Each
-- replica upserts its own sessions while they last (seen_at), and deletes one as it ends; a
-- replica that died leaves rows that go stale. Unlogged: it is rebuilt by the next upserts
-- after a crash or a failover, so its writes cost no WAL.
CREATE UNLOGGED TABLE herald.executor_sessions (
    namespace    text NOT NULL,
    executor_id  text NOT NULL,
    -- One session of the executor (a reconnect replaces it).
    session_id   uuid NOT NULL,
    scheduler_id text NOT NULL,
    -- Empty: every queue.
    queues       text[] NOT NULL,
    -- Credentials refs it can send for; empty: every account's.
    credentials  text[] NOT NULL,
    connected_at timestamptz NOT NULL,
    seen_at      timestamptz NOT NULL,
    PRIMARY KEY (namespace, executor_id)
);
