-- Records (or refreshes) a live session: a reconnect of the same executor replaces the older
-- session's row.
INSERT INTO herald.executor_sessions AS s (namespace, executor_id, session_id, scheduler_id,
                                           queues, credentials, connected_at, seen_at)
VALUES ($1, $2, $3, $4, $5, $6, herald.now(), herald.now())
ON CONFLICT (namespace, executor_id) DO UPDATE
SET session_id = EXCLUDED.session_id, scheduler_id = EXCLUDED.scheduler_id,
    queues = EXCLUDED.queues, credentials = EXCLUDED.credentials, seen_at = herald.now(),
    connected_at = CASE WHEN s.session_id = EXCLUDED.session_id THEN s.connected_at
                        ELSE herald.now() END
