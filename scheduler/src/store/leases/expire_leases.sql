-- Returns leases that ran out without a report to SCHEDULED (or FAILED when that attempt was the
-- last), charging the attempt: the executor may have crashed mid-send, and a task that crashes
-- every executor must not be retried forever. The task keeps its due time, so it is leased
-- again right away. SKIP LOCKED makes concurrent sweepers on several replicas safe.
-- A lease through a WhatsApp Cloud account (migration 16) is different: Meta may have accepted
-- the message before the executor died. If a status callback already named the task, it went
-- out: SUCCEEDED. Otherwise the task waits the grace $2 (ms) for one before it is due again
-- (callbacks::record ends it SUCCEEDED if one comes), unless that attempt was its last.
-- Only reports on the task's current message count (herald.task_reports): one on the message a
-- window-closed fallback replaced (migration 25), or that an earlier attempt sent, says nothing
-- about the last send.
-- A task its campaign's cancel parked for good ends CANCELLED (unless a status says it went).
-- The leases are $3, the tasks lock_lapsed.sql took, row and webhook lock, earlier in this
-- transaction: this statement's snapshot sees every status a webhook batch committed for them
-- first. Returns where the next sweep can start: the sweep's time when it took every lapsed
-- lease it found, else the latest expiry it took.
WITH lapsed AS (
    SELECT s.*, s.sent_message IS NOT NULL AS reported
    FROM (
    SELECT t.id, t.lease_expires_at,
           -- The message a status named: the lapsed attempt's row learns it below, as a report
           -- would have told it, so that a late failure of it, once the task is sent again, is
           -- not taken for the new send's (herald.task_reports knows an earlier attempt's
           -- message by that row; without it a retried failure was retried at every report).
           (SELECT r.provider_message_id
            FROM herald.task_reports(t.id, t.lease_count, t.fallback_replaces) r
            ORDER BY r.occurred_at LIMIT 1) AS sent_message,
           -- A failure among them: SUCCEEDED for now, then settled as a late failure is
           -- (callbacks::settle_failures, by the sweeper in this transaction).
           EXISTS (SELECT 1 FROM herald.message_failure(t.id, t.lease_count, t.fallback_replaces)) AS failed,
           herald.reports_on_messages(t.namespace, t.account_id) AS callbacks,
           -- Parked for good by its campaign's cancel (park_leased_for_good.sql), whose revoke
           -- never ended it (the replica died between the two): it must not come back to wait,
           -- SCHEDULED on a route nothing claims, forever.
           t.route LIKE 'cancelled:%' AS cancelled
    FROM unnest(herald.opaque_to_planner($3::uuid[])) AS i(id)
    JOIN herald.tasks t ON t.id = i.id
    -- One primary-key probe per lease, whatever the statistics say (see extend_leases.sql).
    WHERE t.state::text = 'leased' AND t.lease_expires_at <= herald.now()
    FOR UPDATE OF t
    ) s
),
updated AS (
    UPDATE herald.tasks t
    SET attempts = t.attempts + 1,
        state = CASE
            WHEN l.reported THEN 'succeeded'
            WHEN l.cancelled THEN 'cancelled'
            WHEN t.attempts + 1 >= t.max_attempts THEN 'failed'
            WHEN t.expire_at IS NOT NULL AND t.expire_at <= herald.now() THEN 'expired'
            ELSE 'scheduled'
        END::herald.task_state,
        finished_at = CASE
            WHEN l.reported OR l.cancelled OR t.attempts + 1 >= t.max_attempts
                 OR (t.expire_at IS NOT NULL AND t.expire_at <= herald.now()) THEN herald.now()
            ELSE NULL
        END,
        end_reason = CASE
            WHEN l.reported THEN 'sent'
            WHEN l.cancelled THEN 'cancelled'
            WHEN t.attempts + 1 >= t.max_attempts THEN 'exhausted'
            WHEN t.expire_at IS NOT NULL AND t.expire_at <= herald.now() THEN 'expired'
        END::herald.end_reason,
        -- Whether the lapsed send of a cancelled campaign's task went out, nobody said.
        cancel_outcome = CASE WHEN l.cancelled AND NOT l.reported THEN 5
                              ELSE t.cancel_outcome END,
        run_at = CASE WHEN l.callbacks AND NOT l.reported AND NOT l.cancelled
                      THEN greatest(t.run_at, herald.now() + $2::bigint * interval '1 millisecond')
                      ELSE t.run_at END,
        awaiting_callback_until = CASE WHEN l.callbacks AND NOT l.reported AND NOT l.cancelled
                                       THEN herald.now() + $2::bigint * interval '1 millisecond'
                                       ELSE t.awaiting_callback_until END,
        last_error = 'lease expired without a report from executor ' || COALESCE(t.executor_id, '?'),
        lease_expires_at = NULL,
        updated_at = herald.now()
    FROM lapsed l
    WHERE t.id = l.id
    RETURNING t.id, t.lease_count, t.executor_id, t.leased_at, t.state, t.account_id, t.namespace,
              l.lease_expires_at AS lapsed_at, l.failed, l.sent_message
),
recorded AS (
    INSERT INTO herald.attempts (task_id, attempt, executor_id, outcome, error, leased_at,
                                 account, provider_message_id)
    SELECT u.id, u.lease_count, COALESCE(u.executor_id, ''), 6, 'lease expired',
           COALESCE(u.leased_at, herald.now()), u.account_id, u.sent_message
    FROM updated u
    ON CONFLICT (task_id, attempt) DO NOTHING
)
SELECT count(*)::bigint AS expired,
       count(*) FILTER (WHERE state = 'scheduled')::bigint AS rescheduled,
       -- The tasks the sweep ended, by state, for herald_tasks_finished_total.
       count(*) FILTER (WHERE state = 'succeeded')::bigint AS ended_succeeded,
       count(*) FILTER (WHERE state = 'failed')::bigint AS ended_failed,
       count(*) FILTER (WHERE state = 'expired')::bigint AS ended_expired,
       count(*) FILTER (WHERE state = 'cancelled')::bigint AS ended_cancelled,
       -- Slots freed per account, as '<namespace>/<account>': the lapsed leases held them.
       COALESCE(array_agg(namespace || '/' || account_id) FILTER (WHERE account_id IS NOT NULL), '{}')
           AS freed_accounts,
       CASE WHEN count(*) >= $1 THEN max(lapsed_at) ELSE herald.now() END AS swept_through,
       -- Ended SUCCEEDED although a status reported their message failed, as '<namespace>/<id>'.
       COALESCE(array_agg(namespace || '/' || id::text) FILTER (WHERE state = 'succeeded' AND failed),
                '{}') AS failed_after_sent
FROM updated
