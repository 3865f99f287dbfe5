-- Queues a notification webhook event (recorded only while a replica has a notify URL; see
-- herald.notify_event, migration V5), delivered if the caller's transaction commits.
SELECT herald.notify_event($1, $2::jsonb)
