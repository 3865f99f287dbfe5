-- Pins each message a failure callback names by its callback data ($2 tasks, $3 attempts, $4
-- message ids; namespace $1) to that attempt's row, when a later attempt has been made since
-- and the row knows no message: an attempt whose lease lapsed (its executor died before it
-- reported), or whose answer was lost, never learned the message it sent. herald.task_reports
-- judges a task by its current send and leaves out the messages earlier attempts' rows name;
-- without the pin, the earlier message's failure counted as the next send's (it ended a
-- delivered task FAILED). Only failures pin: an earlier message's acceptance still counts as
-- proof that the task's message went out (accept_awaiting.sql, await_callbacks.sql), so a task
-- waiting after a second lost answer is not sent a third time. The row may have moved to the
-- history with its task.
WITH named AS (
    SELECT DISTINCT ON (n.task_id, n.attempt) n.task_id, n.attempt, n.message
    FROM unnest($2::uuid[], $3::integer[], $4::text[]) AS n(task_id, attempt, message)
    JOIN herald.task_records t ON t.id = n.task_id AND t.namespace = $1
    WHERE n.attempt >= 1 AND n.attempt < t.lease_count
    ORDER BY n.task_id, n.attempt, n.message
),
hot AS (
    UPDATE herald.attempts a
    SET provider_message_id = n.message
    FROM named n
    WHERE a.task_id = n.task_id AND a.attempt = n.attempt AND a.provider_message_id IS NULL
)
UPDATE herald.attempt_history a
SET provider_message_id = n.message
FROM named n
WHERE a.task_id = n.task_id AND a.attempt = n.attempt AND a.provider_message_id IS NULL
