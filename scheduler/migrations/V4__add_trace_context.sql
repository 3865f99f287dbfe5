-- The W3C `traceparent` of the CreateTask span that made the task, so the lease grant and the
-- executor's send join the same trace however much later they happen. NULL when tracing was
-- off and the client sent none.
ALTER TABLE herald.tasks ADD COLUMN trace_parent text;
