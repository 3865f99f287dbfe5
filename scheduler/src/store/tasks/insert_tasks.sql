-- Inserts a batch of validated tasks in one statement; arrays are columns, one element a task,
-- stepped through together by one unnest each in the select list (columns.rs says why).
-- The column lists come from store/tasks/columns.rs (INSERT_INPUTS, CREATED_COLUMNS), filled in
-- at start-up.
-- A task with no explicit run_at is due `delay_ms` after the database's herald.now(), so every due
-- time is on the database clock. The route is what the claim routes by: '<namespace>/' for tasks
-- sent by queue, '<namespace>/p:<pool>' for pooled ones, '<namespace>/a:<account>' for pinned
-- ones, behind 'paused:' while their campaign is paused (no claim probes such a route).
-- A task whose recipient is on the namespace's suppression list (migration 15) is created
-- already ended: CANCELLED before starting, end reason 'suppressed', so the caller sees why.
INSERT INTO herald.tasks AS t (namespace, run_at, retry_delays_ms, route, state, end_reason,
                               cancel_outcome, finished_at, last_error, {stored_columns})
SELECT $1,
       COALESCE(i.given_run_at, herald.now() + i.delay_ms * interval '1 millisecond'),
       CASE WHEN i.retry_delays = '' THEN '{}'::bigint[]
            ELSE string_to_array(i.retry_delays, ',')::bigint[] END,
       CASE WHEN i.parked THEN 'paused:' ELSE '' END
       || $1 || '/' || CASE WHEN i.account_id IS NOT NULL THEN 'a:' || i.account_id
                            WHEN i.pool IS NOT NULL THEN 'p:' || i.pool
                            ELSE '' END,
       CASE WHEN sup.listed THEN 'cancelled' ELSE 'scheduled' END::herald.task_state,
       CASE WHEN sup.listed THEN 'suppressed'::herald.end_reason END,
       CASE WHEN sup.listed THEN 1::smallint END,
       CASE WHEN sup.listed THEN herald.now() END,
       CASE WHEN sup.listed THEN 'not sent: the recipient is on the suppression list' END,
       {stored_values}
FROM (SELECT {inputs}) AS i
CROSS JOIN LATERAL (
    SELECT EXISTS (SELECT 1 FROM herald.suppressions s
                   WHERE s.namespace = $1 AND s.recipient = herald.recipient_key(i.recipient)) AS listed
) sup
-- What the insert computed; the create answers with these and what it sent, without reading
-- the tasks back (InsertArrays::into_records in columns.rs).
RETURNING {created_columns}
