-- Which delivery reports speak for a task: the one rule the callbacks, the sweeper, a task's
-- delivery and the delivery statistics share. Applied by the migrator whenever this file
-- changes, like store/accounts/functions.sql.

-- Earlier forms took a row of herald.tasks; tasks are also read from herald.task_records since
-- migration 28, whose rows are of another type, so the functions take the three fields.
DROP FUNCTION IF EXISTS herald.message_failure(herald.tasks);
DROP FUNCTION IF EXISTS herald.task_reports(herald.tasks);

-- The reports on the message task p_task (with its lease count and the message its fallback
-- replaced) sent last: a task is judged by its current send. Left
-- out are the reports on the message its window-closed fallback replaced (migration 25) and on
-- a message an earlier attempt sent before the task was retried (the task sent again since:
-- that message's failure must not end it, nor its delivery stand for the new one's).
-- A single SELECT in SQL, so the planner inlines it where it is called (FROM, LATERAL, EXISTS)
-- and plans it with the caller's query; most tasks were leased once, which skips the look at
-- their attempts.
CREATE OR REPLACE FUNCTION herald.task_reports(
    p_task uuid, p_lease_count integer, p_fallback_replaces text
)
RETURNS SETOF herald.delivery_events
LANGUAGE sql STABLE AS $$
    SELECT e.*
    FROM herald.delivery_events e
    WHERE e.task_id = p_task
      AND e.provider_message_id IS DISTINCT FROM p_fallback_replaces
      AND (p_lease_count <= 1
           OR NOT EXISTS (SELECT 1 FROM herald.attempt_records a
                          WHERE a.task_id = p_task AND a.attempt < p_lease_count
                            AND a.provider_message_id = e.provider_message_id))
$$;

-- The first failure after acceptance reported for p_task's current message (see task_reports),
-- if any: what ends the task, or sends its window-closed fallback.
CREATE OR REPLACE FUNCTION herald.message_failure(
    p_task uuid, p_lease_count integer, p_fallback_replaces text
)
RETURNS SETOF herald.delivery_events
LANGUAGE sql STABLE AS $$
    SELECT r.*
    FROM herald.task_reports(p_task, p_lease_count, p_fallback_replaces) r
    WHERE r.state = 4
    ORDER BY r.occurred_at
    LIMIT 1
$$;

-- Whether account p_account of p_namespace sends through a provider that reports on every
-- message by status callback (WhatsApp Cloud): a send of unknown outcome through it waits for
-- one before it is sent again (expire_leases.sql, await_callbacks.sql). No account (a task
-- sent by queue alone): no.
CREATE OR REPLACE FUNCTION herald.reports_on_messages(p_namespace text, p_account text)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM herald.accounts a
                   WHERE a.namespace = p_namespace AND a.id = p_account
                     AND a.sender_kind = 'whatsapp_cloud')
$$;
