-- Inserts a batch of validated tasks in one statement; arrays are columns, one element a task.
-- The column lists come from store/tasks/columns.rs (INSERT_INPUTS, TASK_COLUMNS), filled in
-- at start-up.
-- A task with no explicit run_at is due `delay_ms` after the database's herald.now(), so every due
-- time is on the database clock. The route is what the claim routes by: '<namespace>/' for tasks
-- sent by queue, '<namespace>/p:<pool>' for pooled ones, '<namespace>/a:<account>' for pinned
-- ones, behind 'paused:' while their campaign is paused (no claim probes such a route).
INSERT INTO herald.tasks AS t (namespace, run_at, retry_delays_ms, route, {stored_columns})
SELECT $1,
       COALESCE(i.given_run_at, herald.now() + i.delay_ms * interval '1 millisecond'),
       CASE WHEN i.retry_delays = '' THEN '{}'::bigint[]
            ELSE string_to_array(i.retry_delays, ',')::bigint[] END,
       CASE WHEN i.parked THEN 'paused:' ELSE '' END
       || $1 || '/' || CASE WHEN i.account_id IS NOT NULL THEN 'a:' || i.account_id
                            WHEN i.pool IS NOT NULL THEN 'p:' || i.pool
                            ELSE '' END,
       {stored_values}
FROM unnest({inputs}) AS i({input_names})
-- What the create answers with: the tasks as stored, without reading them back.
RETURNING {task_columns}
