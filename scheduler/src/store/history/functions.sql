-- The history's views, its partitions and the way back from it (migration V28), re-applied by
-- the migrator whenever this file changes and after every run that applied a numbered
-- migration (a new column of herald.tasks reaches the views that way).

-- Every task, hot or finished and moved out: what GetTask, ListTasks, the statistics and the
-- console read. A task is in exactly one of the two in any snapshot (it moves in one
-- transaction), so the union never shows it twice.
CREATE OR REPLACE VIEW herald.task_records AS
    SELECT * FROM herald.tasks
    UNION ALL
    SELECT * FROM herald.task_history;

-- Every attempt, of hot and moved tasks alike.
CREATE OR REPLACE VIEW herald.attempt_records AS
    SELECT * FROM herald.attempts
    UNION ALL
    SELECT * FROM herald.attempt_history;


-- Makes the partitions that hold tasks ended in [p_from, p_to], p_width wide and aligned to
-- multiples of it from the epoch, each clipped to its neighbours so that a width changed
-- between runs never overlaps an existing one. Returns how many pairs it made. Serialised by
-- an advisory lock across replicas (the drops take it too); gives up (lock_not_available)
-- after p_lock_timeout: the retention job tries again next pass, long before the partition is
-- needed.
CREATE OR REPLACE FUNCTION herald.ensure_history_partitions(
    p_from timestamptz, p_to timestamptz, p_width interval, p_lock_timeout interval
) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_width double precision := greatest(extract(epoch FROM p_width), 1);
    v_at timestamptz := p_from;
    v_lower timestamptz;
    v_upper timestamptz;
    v_suffix text;
    v_made integer := 0;
BEGIN
    PERFORM pg_advisory_xact_lock(7526744137461661953);
    PERFORM set_config('lock_timeout', (extract(epoch FROM p_lock_timeout) * 1000)::bigint::text,
                       true);
    WHILE v_at <= p_to LOOP
        SELECT p.upper INTO v_upper FROM herald.history_partitions p
        WHERE p.lower <= v_at AND p.upper > v_at;
        IF NOT FOUND THEN
            v_lower := to_timestamp(floor(extract(epoch FROM v_at) / v_width) * v_width);
            v_upper := v_lower + v_width * interval '1 second';
            SELECT greatest(v_lower, max(p.upper)) INTO v_lower FROM herald.history_partitions p
            WHERE p.upper > v_lower AND p.upper <= v_at;
            SELECT least(v_upper, min(p.lower)) INTO v_upper FROM herald.history_partitions p
            WHERE p.lower > v_at AND p.lower < v_upper;
            v_suffix := (extract(epoch FROM v_lower) * 1000)::bigint::text;
            -- Made apart, then attached: ATTACH takes only a SHARE UPDATE EXCLUSIVE lock on the
            -- parent, which no read or write of the history waits for or holds; CREATE TABLE
            -- PARTITION OF would lock the parent against every reader.
            EXECUTE format('CREATE TABLE herald.%I (LIKE herald.task_history INCLUDING DEFAULTS)',
                           'task_history_' || v_suffix);
            EXECUTE format('ALTER TABLE herald.task_history ATTACH PARTITION herald.%I '
                           'FOR VALUES FROM (%L) TO (%L)', 'task_history_' || v_suffix,
                           v_lower, v_upper);
            EXECUTE format('CREATE TABLE herald.%I (LIKE herald.attempt_history INCLUDING DEFAULTS)',
                           'attempt_history_' || v_suffix);
            EXECUTE format('ALTER TABLE herald.attempt_history ATTACH PARTITION herald.%I '
                           'FOR VALUES FROM (%L) TO (%L)', 'attempt_history_' || v_suffix,
                           v_lower, v_upper);
            INSERT INTO herald.history_partitions (lower, upper, suffix)
            VALUES (v_lower, v_upper, v_suffix);
            v_made := v_made + 1;
        END IF;
        v_at := v_upper;
    END LOOP;
    RETURN v_made;
END
$$;

-- Deletes what outlived the tasks of partition pair p_suffix only to be deleted with them: their
-- delivery reports and duplicate content guard rows. Run before the pair is detached and
-- dropped (store/history/mod.rs says why not here). Returns how many tasks the pair holds.
CREATE OR REPLACE FUNCTION herald.forget_history_partition(p_suffix text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_tasks bigint;
BEGIN
    -- Already dropped by a pass cut short before it forgot the pair.
    IF to_regclass(format('herald.%I', 'task_history_' || p_suffix)) IS NULL THEN
        RETURN 0;
    END IF;
    EXECUTE format('DELETE FROM herald.delivery_events e USING herald.%I h '
                   'WHERE e.task_id = h.id', 'task_history_' || p_suffix);
    EXECUTE format('DELETE FROM herald.content_guard g USING herald.%I h '
                   'WHERE g.task_id = h.id', 'task_history_' || p_suffix);
    EXECUTE format('SELECT count(*) FROM herald.%I', 'task_history_' || p_suffix) INTO v_tasks;
    RETURN v_tasks;
END
$$;

-- Brings the tasks among p_ids that are in the history back into herald.tasks, with their
-- attempts, so that a write meant for a finished task (a retry, a late delivery failure, a
-- window-closed fallback) finds it where every write looks. Run in the writer's transaction:
-- the rows it inserts are invisible to the retention job until that commits, so the job cannot
-- move them out again in between. A task that stays finished is moved out again later. Its
-- idempotency key is kept again while the task is hot. Returns the tasks brought back.
-- First it locks those still in herald.tasks: a move of one under way (deleted from the hot
-- table, not yet committed into the history, so invisible to both look-ups) is waited for,
-- and the second statement, with a snapshot of its own, then finds the task in the history;
-- without the wait the writer would find it nowhere and its change would be lost. The lock
-- also keeps the job from moving those rows until the writer commits.
CREATE OR REPLACE FUNCTION herald.restore_tasks(p_ids uuid[]) RETURNS SETOF uuid
LANGUAGE sql AS $$
    -- In id order: two writers restoring overlapping tasks take the rows in one order and so
    -- never deadlock with each other.
    SELECT 1 FROM herald.tasks WHERE id = ANY (p_ids) ORDER BY id FOR UPDATE;
    WITH back AS (
        DELETE FROM herald.task_history h WHERE h.id = ANY (p_ids) RETURNING h.*
    ),
    tasks_in AS (
        INSERT INTO herald.tasks SELECT * FROM back
    ),
    attempts_back AS (
        DELETE FROM herald.attempt_history a USING back b
        WHERE a.task_id = b.id AND a.task_finished_at = b.finished_at
        RETURNING jsonb_populate_record(a, '{"task_finished_at": null}') AS r
    ),
    attempts_in AS (
        INSERT INTO herald.attempts SELECT (r).* FROM attempts_back
    ),
    keys AS (
        UPDATE herald.idempotency_keys k SET forget_after = NULL
        FROM back b WHERE k.task_id = b.id
    )
    SELECT id FROM back
$$;
