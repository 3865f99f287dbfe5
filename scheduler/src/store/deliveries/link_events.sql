-- Ties the reports of namespace $1 recorded without a task to the task now known for their
-- message: pairs of message id ($2) and task ($3). Returns the reports tied.
UPDATE herald.delivery_events e
SET task_id = l.task_id
FROM unnest($2::text[], $3::uuid[]) AS l(provider_message_id, task_id)
WHERE e.namespace = $1 AND e.provider_message_id = l.provider_message_id AND e.task_id IS NULL
RETURNING e.provider_message_id, e.state, e.task_id
