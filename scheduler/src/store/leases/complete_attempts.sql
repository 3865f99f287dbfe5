-- Applies a batch of attempt results in one statement.
-- A result counts only while its fencing token (task id, lease_count) still names the task's
-- current lease: a report from an attempt whose lease expired and was granted again matches no
-- row and changes nothing. A task cancelled while leased still takes its result, to learn
-- whether the message went out, but stays CANCELLED; one whose lapsed lease the sweeper ended
-- (no lease_expires_at left) is settle_late_reports.sql's. A task its campaign's cancel
-- parked for good (a route 'cancelled:…', park_leased_for_good.sql) whose send failed ends
-- CANCELLED instead of coming back SCHEDULED on a route nothing claims.
-- A report ($10) saying the window-closed fallback went instead of the content (refused with
-- 131047), whatever the fallback's own outcome, marks the fallback used: later leases send it
-- as the content and none carries it again, so it is never triggered twice (migration 25).
-- Each task is decided in the UPDATE itself, from the row it writes, without reading it under
-- FOR UPDATE first (a lock on every row, then a new version of it: two writes per task). A
-- row changed concurrently is re-read by the UPDATE, which re-checks the token and decides
-- again on the new version.
-- Every array is hidden from the planner's estimates (migration 30): the plan stays one
-- primary-key probe per result, whatever the batch's size, and PostgreSQL settles on one
-- generic plan (planned for the ids at hand, a small report looked cheaper than the generic
-- plan and was planned afresh at every execution; S3 in docs/performance.md). Given the real
-- size of a large batch, the planner hash-joined a sequential scan of the whole table.
WITH updated AS (
    UPDATE herald.tasks t
    SET (state, attempts, run_at, finished_at, cancel_outcome, last_error, end_reason, end_code,
         window_closed_fallback_at, lease_expires_at, updated_at) = (
        SELECT e.new_state,
               d.new_attempts,
               CASE WHEN e.new_state = 'scheduled' THEN d.next_run ELSE t.run_at END,
               CASE WHEN e.new_state = 'scheduled' THEN NULL
                    ELSE COALESCE(t.finished_at, herald.now()) END,
               CASE WHEN t.state <> 'cancelled' AND e.new_state <> 'cancelled'
                    THEN t.cancel_outcome
                    WHEN i.outcome = 1 THEN 3 ELSE 4 END,
               CASE WHEN i.outcome = 1 THEN t.last_error ELSE i.error END,
               e.new_reason,
               CASE WHEN e.new_reason IN ('permanent_error', 'invalid_recipient')
                    THEN i.error_code END,
               -- Only a lease that carried a fallback can have sent one.
               CASE WHEN i.fallback AND t.window_closed_fallback IS NOT NULL
                         AND t.window_closed_fallback_at IS NULL THEN herald.now()
                    ELSE t.window_closed_fallback_at END,
               NULL::timestamptz,
               herald.now()
        FROM (
            SELECT
                -- ACCOUNT_UNAVAILABLE (5) from an account says nothing about the task: it is
                -- not charged (the account goes offline instead). Nor is RATE_LIMITED (2) for a
                -- pooled task, up to 10 times: the account (or the pair) is what was
                -- throttled, and another account of the pool may send it at once. A task sent
                -- by queue alone has no account to take offline: its ACCOUNT_UNAVAILABLE (a
                -- webhook endpoint gone, say) is charged and backs off like TRANSIENT, or
                -- it would be leased and sent again at once, forever.
                t.attempts + CASE WHEN r.uncharged THEN 0 ELSE 1 END AS new_attempts,
                r.uncharged,
                -- A provider's retry-after wins over the formula. Uncharged outcomes are due
                -- again at once: the claim routes them to another account of the pool (the
                -- throttled or offline account has no room; a pinned task waits for its account
                -- instead, which the claim also handles). Sent (1) and permanent failures (4)
                -- are never retried: no delay to draw.
                CASE WHEN i.outcome IN (1, 4) THEN NULL
                     WHEN r.uncharged THEN herald.now()
                     ELSE herald.now() + COALESCE(i.retry_after_ms,
                                 herald.retry_delay_ms(t.attempts + 1, t.retry_delays_ms,
                                                       t.backoff_initial_ms, t.backoff_max_ms,
                                                       t.backoff_multiplier, t.backoff_jitter))
                        * interval '1 millisecond' END AS next_run
            FROM (SELECT (i.outcome = 5 AND t.account_id IS NOT NULL)
                         OR (i.outcome = 2 AND position('/p:' IN t.route) > 0
                             AND t.lease_count - t.attempts <= 10) AS uncharged) r
        ) d
        CROSS JOIN LATERAL (
            SELECT
                CASE
                    WHEN t.state = 'cancelled' THEN 'cancelled'
                    WHEN i.outcome = 1 THEN 'succeeded'
                    WHEN i.outcome = 4 THEN 'failed'
                    WHEN t.route LIKE 'cancelled:%' THEN 'cancelled'
                    WHEN NOT d.uncharged AND d.new_attempts >= t.max_attempts THEN 'failed'
                    WHEN t.expire_at IS NOT NULL AND d.next_run >= t.expire_at THEN 'expired'
                    ELSE 'scheduled'
                END::herald.task_state AS new_state,
                -- Why it ended (migration 14); NULL while it goes on. A permanent refusal
                -- whose code says the recipient cannot receive messages at all (WhatsApp
                -- 131026: not a WhatsApp number; WeCom 81013: no such user) is told apart
                -- from other refusals.
                CASE
                    WHEN t.state = 'cancelled' THEN 'cancelled'
                    WHEN i.outcome = 1 THEN 'sent'
                    WHEN i.outcome = 4 AND i.error_code IN (131026, 81013)
                        THEN 'invalid_recipient'
                    WHEN i.outcome = 4 THEN 'permanent_error'
                    WHEN t.route LIKE 'cancelled:%' THEN 'cancelled'
                    WHEN NOT d.uncharged AND d.new_attempts >= t.max_attempts THEN 'exhausted'
                    WHEN t.expire_at IS NOT NULL AND d.next_run >= t.expire_at THEN 'expired'
                END::herald.end_reason AS new_reason
        ) e
    )
    FROM unnest(herald.opaque_to_planner($1::uuid[]), herald.opaque_to_planner($2::integer[]),
                herald.opaque_to_planner($3::smallint[]), herald.opaque_to_planner($4::text[]),
                herald.opaque_to_planner($5::text[]), herald.opaque_to_planner($6::bigint[]),
                herald.opaque_to_planner($7::timestamptz[]),
                herald.opaque_to_planner($9::bigint[]), herald.opaque_to_planner($10::boolean[]))
        AS i(task_id, attempt, outcome, error, provider_message_id, retry_after_ms, started_at,
             error_code, fallback)
    -- $8: the reporting session's namespace; another namespace's tasks match nothing.
    WHERE t.id = i.task_id AND t.lease_count = i.attempt AND t.namespace = $8
      AND (t.state = 'leased'
           OR (t.state = 'cancelled' AND t.cancel_outcome = 5 AND t.lease_expires_at IS NOT NULL))
    -- RETURNING sees the row as written. A task cancelled before (whose slot went back then)
    -- kept the finished_at of its cancel; one this report ended CANCELLED, from a parked
    -- route, has this transaction's, as a fallback used now does. leased_at, executor_id and
    -- account_id are the lease's, which the report does not change.
    RETURNING t.id, t.lease_count, t.state, t.run_at, t.account_id, t.executor_id, t.leased_at,
              t.state = 'cancelled' AND t.finished_at <> herald.now() AS was_cancelled,
              i.outcome, i.error, i.provider_message_id, i.retry_after_ms, i.started_at,
              i.error_code,
              i.fallback AND t.window_closed_fallback_at = herald.now() AS fallback
),
recorded AS (
    INSERT INTO herald.attempts (task_id, attempt, executor_id, outcome, error,
                                 provider_message_id, retry_after_ms, leased_at, started_at,
                                 account, error_code, window_closed_fallback)
    SELECT u.id, u.lease_count, COALESCE(u.executor_id, ''), u.outcome, u.error,
           u.provider_message_id, u.retry_after_ms, COALESCE(u.leased_at, herald.now()),
           u.started_at, u.account_id, u.error_code, u.fallback
    FROM updated u
    -- No ON CONFLICT: attempt row (id, n) is written only where lease n ends, by this report
    -- or by the sweeper (expire_leases.sql), and both first move the task out of lease n under
    -- its row lock, so the second finds no row to update and records nothing. A release or a
    -- refused grant records no attempt, and the next lease takes a new number. Probing the
    -- unique index before each insert cost about 3 % of S1 (docs/performance.md, "The report's
    -- attempt rows without ON CONFLICT").
)
SELECT id, lease_count, state::text AS state, run_at, account_id, was_cancelled,
       -- For ACCOUNT_UNAVAILABLE (5), which gives the account's daily count back: whether the
       -- lease was granted on the account's current local day (a lease from before its
       -- midnight was counted on the day before, so the new day's count keeps it). Only those
       -- rows look the account up.
       CASE WHEN outcome = 5 AND account_id IS NOT NULL
            THEN (SELECT (leased_at AT TIME ZONE a.time_zone)::date
                         = (herald.now() AT TIME ZONE a.time_zone)::date
                  FROM herald.accounts a WHERE a.namespace = $8 AND a.id = account_id)
       END AS counted_today
FROM updated
