-- Applies a batch of attempt results in one statement.
-- A result counts only while its fencing token (task id, lease_count) still names the task's
-- current lease: a report from an attempt whose lease expired and was granted again matches no
-- row and changes nothing. A task cancelled while leased still takes its result, to learn
-- whether the message went out, but stays CANCELLED.
-- A report ($10) saying the window-closed fallback went instead of the content (refused with
-- 131047), whatever the fallback's own outcome, marks the fallback used: later leases send it
-- as the content and none carries it again, so it is never triggered twice (migration 25).
-- The ids are hidden from the planner's estimates (migration 30), here and in the UPDATE's
-- pin below, so that PostgreSQL settles on one generic plan: planned for the ids at hand, a
-- report of a few tasks looked cheaper than the generic plan and was planned afresh at every
-- execution, about 0.8 ms of CPU each time, more than its execution (S3 in docs/performance.md).
WITH input AS (
    SELECT *
    FROM unnest(herald.opaque_to_planner($1::uuid[]), $2::integer[], $3::smallint[],
                $4::text[], $5::text[], $6::bigint[], $7::timestamptz[], $9::bigint[],
                $10::boolean[])
        AS i(task_id, attempt, outcome, error, provider_message_id, retry_after_ms, started_at,
             error_code, fallback)
),
decided AS (
    SELECT t.id, i.attempt, i.outcome, i.error, i.provider_message_id, i.retry_after_ms,
           i.started_at, i.error_code, t.executor_id, t.leased_at, t.account_id,
           -- Only a lease that carried a fallback can have sent one.
           i.fallback AND t.window_closed_fallback IS NOT NULL
               AND t.window_closed_fallback_at IS NULL AS fallback,
           t.state AS old_state,
           -- ACCOUNT_UNAVAILABLE (5) says nothing about the task: it is not charged. Nor is
           -- RATE_LIMITED (2) for a pooled task, up to 10 times: the account (or the pair) is
           -- what was throttled, and another account of the pool may send it at once.
           t.attempts + CASE WHEN i.outcome = 5 THEN 0
                             WHEN i.outcome = 2 AND r.rerouted THEN 0 ELSE 1 END AS new_attempts,
           -- A provider's retry-after wins over the formula. ACCOUNT_UNAVAILABLE and a pooled
           -- RATE_LIMITED are due again at once: the claim routes them to another account of
           -- the pool (the throttled account has no room; a pinned task waits for its account
           -- instead, which the claim also handles).
           -- Sent (1) and permanent failures (4) are never retried: no delay to draw.
           CASE WHEN i.outcome IN (1, 4) THEN NULL
                WHEN i.outcome = 5 OR (i.outcome = 2 AND r.rerouted) THEN herald.now()
                ELSE herald.now() + COALESCE(i.retry_after_ms,
                            herald.retry_delay_ms(t.attempts + 1, t.retry_delays_ms,
                                                  t.backoff_initial_ms, t.backoff_max_ms,
                                                  t.backoff_multiplier, t.backoff_jitter))
                   * interval '1 millisecond' END AS next_run,
           t.max_attempts, t.expire_at
    FROM input i
    -- One primary-key probe per report, forced by LATERAL: as a join, the planner's custom
    -- plans for a prepared statement's first executions hash-joined a sequential scan of the
    -- whole table (measured: 20-100 ms instead of 10 ms for 500 reports at 50,000 tasks).
    CROSS JOIN LATERAL (
        SELECT *
        FROM herald.tasks t
        -- $8: the reporting session's namespace; another namespace's tasks match nothing.
        WHERE t.id = i.task_id AND t.lease_count = i.attempt AND t.namespace = $8
          AND (t.state = 'leased' OR (t.state = 'cancelled' AND t.cancel_outcome = 5))
        FOR UPDATE
    ) t
    CROSS JOIN LATERAL (
        SELECT position('/p:' IN t.route) > 0 AND t.lease_count - t.attempts <= 10 AS rerouted
    ) r
),
planned AS (
    SELECT d.*,
           CASE
               WHEN d.old_state = 'cancelled' THEN 'cancelled'
               WHEN d.outcome = 1 THEN 'succeeded'
               WHEN d.outcome = 4 THEN 'failed'
               WHEN d.outcome <> 5 AND d.new_attempts >= d.max_attempts THEN 'failed'
               WHEN d.expire_at IS NOT NULL AND d.next_run >= d.expire_at THEN 'expired'
               ELSE 'scheduled'
           END::herald.task_state AS new_state,
           -- Why it ended (migration 14); NULL while it goes on. A permanent refusal whose
           -- code says the recipient cannot receive messages at all (WhatsApp 131026: not a
           -- WhatsApp number; WeCom 81013: no such user) is told apart from other refusals.
           CASE
               WHEN d.old_state = 'cancelled' THEN 'cancelled'
               WHEN d.outcome = 1 THEN 'sent'
               WHEN d.outcome = 4 AND d.error_code IN (131026, 81013) THEN 'invalid_recipient'
               WHEN d.outcome = 4 THEN 'permanent_error'
               WHEN d.outcome <> 5 AND d.new_attempts >= d.max_attempts THEN 'exhausted'
               WHEN d.expire_at IS NOT NULL AND d.next_run >= d.expire_at THEN 'expired'
           END::herald.end_reason AS new_reason
    FROM decided d
),
updated AS (
    UPDATE herald.tasks t
    SET state = p.new_state,
        attempts = p.new_attempts,
        run_at = CASE WHEN p.new_state = 'scheduled' THEN p.next_run ELSE t.run_at END,
        finished_at = CASE WHEN p.new_state = 'scheduled' THEN NULL
                           ELSE COALESCE(t.finished_at, herald.now()) END,
        cancel_outcome = CASE WHEN p.old_state <> 'cancelled' THEN t.cancel_outcome
                              WHEN p.outcome = 1 THEN 3 ELSE 4 END,
        last_error = CASE WHEN p.outcome = 1 THEN t.last_error ELSE p.error END,
        end_reason = p.new_reason,
        end_code = CASE WHEN p.new_reason IN ('permanent_error', 'invalid_recipient')
                        THEN p.error_code END,
        window_closed_fallback_at = CASE WHEN p.fallback THEN herald.now()
                                         ELSE t.window_closed_fallback_at END,
        lease_expires_at = NULL,
        updated_at = herald.now()
    FROM planned p
    -- = ANY(ARRAY(...)) pins the update to primary-key lookups (a plain join on id may plan a
    -- hash join over a sequential scan, as above).
    WHERE t.id = ANY(ARRAY(SELECT pinned.id FROM planned pinned)) AND t.id = p.id
    -- A task cancelled while leased gave its account slot back when it was cancelled.
    RETURNING t.id, t.lease_count, t.state::text, t.run_at, t.account_id,
              p.old_state = 'cancelled' AS was_cancelled
),
recorded AS (
    INSERT INTO herald.attempts (task_id, attempt, executor_id, outcome, error,
                                 provider_message_id, retry_after_ms, leased_at, started_at,
                                 account, error_code, window_closed_fallback)
    SELECT p.id, p.attempt, COALESCE(p.executor_id, ''), p.outcome, p.error,
           p.provider_message_id, p.retry_after_ms, COALESCE(p.leased_at, herald.now()), p.started_at,
           p.account_id, p.error_code, p.fallback
    FROM planned p
    ON CONFLICT (task_id, attempt) DO NOTHING
)
-- Straight from the UPDATE: joining the two CTEs back on id made the planner compare every
-- updated row with every planned one (a nested loop over CTE scans, quadratic in the batch:
-- uuid_eq was the top herald symbol in PostgreSQL's profile of the S1 drain).
SELECT id, lease_count, state, run_at, account_id, was_cancelled
FROM updated
