-- An experiment, not part of herald: how much database work a lease kept out of the wide task
-- row would save (#18, docs/performance.md "What a lease in a narrow table would buy").
--
-- Two drains of the same due tasks on herald's real schema, entirely inside the server (no
-- client, no herald process), claim 512 and complete, two sessions at once:
--   A  the bench's plain-SQL baseline: the lease is an update of the wide herald.tasks row
--      (a new row version with its index entries), and so is the completion;
--   B  the due entry and the lease in narrow tables of their own (due_q, lease_q): a claim
--      deletes due entries and inserts leases, and the wide row is written once, at completion.
-- Run with bench/experiments/narrow_lease.sh against a database herald has migrated.

CREATE TABLE IF NOT EXISTS herald.due_q (
    id uuid PRIMARY KEY,
    route text NOT NULL,
    priority smallint NOT NULL,
    run_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS due_q_walk ON herald.due_q (route, priority DESC, run_at);
CREATE TABLE IF NOT EXISTS herald.lease_q (
    task_id uuid PRIMARY KEY,
    lease_count int NOT NULL,
    executor_id text NOT NULL,
    leased_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS lease_q_expiry ON herald.lease_q (expires_at);

-- Empties the tables and loads p_tasks due tasks (and, for B, their due entries).
CREATE OR REPLACE PROCEDURE herald.exp_reset(p_variant text, p_tasks int)
LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE herald.tasks CASCADE;
    TRUNCATE herald.attempts, herald.due_q, herald.lease_q;
    INSERT INTO herald.tasks (id, queue, recipient, content, priority, run_at, max_attempts,
                              backoff_initial_ms, backoff_max_ms, backoff_multiplier,
                              backoff_jitter, route)
    SELECT (lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0')
            || lpad(to_hex(i), 20, '0'))::uuid,
           'bench', 'recipient-' || i, '\x0a11'::bytea, 5,
           now() - interval '1 minute' + i * interval '1 microsecond',
           10, 1000, 3600000, 2, 0.2, 'default/'
    FROM generate_series(0, p_tasks - 1) AS i;
    IF p_variant = 'B' THEN
        INSERT INTO herald.due_q SELECT id, route, priority, run_at FROM herald.tasks;
    END IF;
END $$;

-- Claims p_batch and completes them, committing each, until nothing is due.
CREATE OR REPLACE PROCEDURE herald.exp_drain(p_variant text, p_batch int)
LANGUAGE plpgsql AS $$
DECLARE
    v_ids uuid[];
    v_counts int[];
BEGIN
    LOOP
        IF p_variant = 'A' THEN
            WITH c AS (
                UPDATE herald.tasks t
                SET state = 'leased', lease_count = t.lease_count + 1, executor_id = 'exp',
                    leased_at = now(), lease_expires_at = now() + interval '30 seconds',
                    updated_at = now()
                WHERE t.id = ANY(ARRAY(
                    SELECT id FROM herald.tasks
                    WHERE state = 'scheduled' AND route = 'default/' AND priority = 5
                      AND run_at <= now()
                    ORDER BY run_at LIMIT p_batch FOR UPDATE SKIP LOCKED))
                RETURNING t.id, t.lease_count, t.queue, t.recipient, t.content, t.labels)
            SELECT array_agg(id), array_agg(lease_count) INTO v_ids, v_counts FROM c;
        ELSE
            WITH d AS (
                DELETE FROM herald.due_q q
                WHERE q.id = ANY(ARRAY(
                    SELECT id FROM herald.due_q
                    WHERE route = 'default/' AND priority = 5 AND run_at <= now()
                    ORDER BY run_at LIMIT p_batch FOR UPDATE SKIP LOCKED))
                RETURNING q.id
            ), l AS (
                INSERT INTO herald.lease_q (task_id, lease_count, executor_id, leased_at,
                                            expires_at)
                SELECT t.id, t.lease_count + 1, 'exp', now(), now() + interval '30 seconds'
                FROM herald.tasks t WHERE t.id = ANY(ARRAY(SELECT id FROM d))
                RETURNING task_id, lease_count
            ), c AS (
                SELECT t.id, l.lease_count, t.queue, t.recipient, t.content, t.labels
                FROM l JOIN herald.tasks t ON t.id = l.task_id)
            SELECT array_agg(id), array_agg(lease_count) INTO v_ids, v_counts FROM c;
        END IF;
        COMMIT;
        EXIT WHEN v_ids IS NULL;
        IF p_variant = 'A' THEN
            WITH done AS (
                UPDATE herald.tasks t
                SET state = 'succeeded', attempts = t.attempts + 1, finished_at = now(),
                    lease_expires_at = NULL, updated_at = now()
                WHERE t.id = ANY(v_ids) AND t.state = 'leased'
                  AND t.lease_count = v_counts[array_position(v_ids, t.id)]
                RETURNING t.id, t.lease_count, t.executor_id, t.leased_at)
            INSERT INTO herald.attempts (task_id, attempt, executor_id, outcome, leased_at,
                                         started_at)
            SELECT id, lease_count, executor_id, 1, leased_at, now() FROM done;
        ELSE
            WITH l AS (
                DELETE FROM herald.lease_q l
                WHERE l.task_id = ANY(v_ids)
                  AND l.lease_count = v_counts[array_position(v_ids, l.task_id)]
                RETURNING l.task_id, l.lease_count, l.executor_id, l.leased_at
            ), done AS (
                UPDATE herald.tasks t
                SET state = 'succeeded', attempts = t.attempts + 1, lease_count = l.lease_count,
                    executor_id = l.executor_id, leased_at = l.leased_at, finished_at = now(),
                    updated_at = now()
                FROM l WHERE t.id = l.task_id
                RETURNING t.id, t.lease_count, t.executor_id, t.leased_at)
            INSERT INTO herald.attempts (task_id, attempt, executor_id, outcome, leased_at,
                                         started_at)
            SELECT id, lease_count, executor_id, 1, leased_at, now() FROM done;
        END IF;
        COMMIT;
    END LOOP;
END $$;
