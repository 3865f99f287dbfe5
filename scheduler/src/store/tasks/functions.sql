-- Functions over live tasks: recipient-local send windows, and the count behind the live-task
-- gauge. Applied by the migrator whenever this file changes, like store/accounts/functions.sql.

-- Earlier forms returned no `due` column; a function's result type is not replaced in place.
DROP FUNCTION IF EXISTS herald.live_task_counts();

-- Live tasks (scheduled, leased) by state and queue, for the herald_tasks gauge, and of the
-- scheduled ones those due now and not parked behind a paused campaign (`due`, for
-- herald_tasks_due: a backlog of work that should be going out, which future and parked tasks
-- are not). Only the two
-- live states, through their partial indexes while that is cheaper than reading the table. With
-- millions of live tasks the count reads most of the table, and PostgreSQL ran it with two
-- parallel workers: on a two-core machine that took every core from the claims for about two
-- seconds at each refresh, and grants due meanwhile were late by up to 23 ms (10M tasks;
-- docs/performance.md, S4). Without workers it takes one backend, leaving the rest to the
-- claims; a background figure may take longer.
CREATE OR REPLACE FUNCTION herald.live_task_counts()
RETURNS TABLE (state text, queue text, tasks bigint, due bigint)
LANGUAGE sql STABLE
SET max_parallel_workers_per_gather = 0
AS $$
    SELECT t.state::text, t.queue, count(*),
           count(*) FILTER (WHERE t.state = 'scheduled' AND t.run_at <= herald.now()
                              AND t.route NOT LIKE 'paused:%')
    FROM herald.tasks t
    -- Or-ed, not listed: the planner combines the two states' partial indexes for the arms of
    -- an OR, not for the values of an `IN (...)` (migration 31), when reading them is cheaper.
    WHERE t.state = 'scheduled' OR t.state = 'leased'
    GROUP BY 1, 2
$$;

-- Recipient-local send windows (docs/accounts.md): a task with a window is only sent between
-- window_start and window_end in window_zone.

-- When a task whose window is closed at p_now may go: the window's next opening plus a spread
-- of up to p_spread_ms (default 30 minutes, at most the window's length) drawn from the task's
-- id, so a window opens with the tasks it held spread out rather than in one burst. NULL while
-- the window is open (or the task has none). A window whose end is earlier than its start
-- spans midnight.
CREATE OR REPLACE FUNCTION herald.window_defer_to(
    p_id uuid, p_start time, p_end time, p_zone text, p_spread_ms bigint, p_now timestamptz
) RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_local timestamp;
    v_time time;
    v_open timestamp;
    v_length_ms bigint;
    v_spread_ms bigint;
BEGIN
    IF p_start IS NULL OR p_end IS NULL THEN
        RETURN NULL;
    END IF;
    v_local := p_now AT TIME ZONE coalesce(p_zone, 'UTC');
    v_time := v_local::time;
    IF (p_start < p_end AND v_time >= p_start AND v_time < p_end)
       OR (p_start > p_end AND (v_time >= p_start OR v_time < p_end)) THEN
        RETURN NULL;
    END IF;
    v_open := v_local::date + p_start;
    IF v_open <= v_local THEN
        v_open := v_open + interval '1 day';
    END IF;
    v_length_ms := (extract(epoch FROM (p_end - p_start)) * 1000)::bigint;
    IF v_length_ms <= 0 THEN
        v_length_ms := v_length_ms + 86400000;
    END IF;
    v_spread_ms := greatest(least(coalesce(p_spread_ms, 1800000), v_length_ms - 1000), 1);
    RETURN (v_open AT TIME ZONE coalesce(p_zone, 'UTC'))
           + ((hashtextextended(p_id::text, 0) & 9223372036854775807) % v_spread_ms)
             * interval '1 millisecond';
END
$$;
