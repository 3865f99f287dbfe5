-- Forgets a session that ended, unless a newer session of the executor replaced it.
DELETE FROM herald.executor_sessions
WHERE namespace = $1 AND executor_id = $2 AND session_id = $3
