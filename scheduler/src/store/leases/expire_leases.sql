-- Returns leases that ran out without a report to SCHEDULED (or FAILED when that attempt was the
-- last), charging the attempt: the executor may have crashed mid-send, and a task that crashes
-- every executor must not be retried forever. The task keeps its due time, so it is leased
-- again right away. SKIP LOCKED makes concurrent sweepers on several replicas safe.
WITH lapsed AS (
    SELECT id
    FROM herald.tasks
    WHERE state = 'leased' AND lease_expires_at <= herald.now()
    ORDER BY lease_expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
),
updated AS (
    UPDATE herald.tasks t
    SET attempts = t.attempts + 1,
        state = CASE
            WHEN t.attempts + 1 >= t.max_attempts THEN 'failed'
            WHEN t.expire_at IS NOT NULL AND t.expire_at <= herald.now() THEN 'expired'
            ELSE 'scheduled'
        END::herald.task_state,
        finished_at = CASE
            WHEN t.attempts + 1 >= t.max_attempts
                 OR (t.expire_at IS NOT NULL AND t.expire_at <= herald.now()) THEN herald.now()
            ELSE NULL
        END,
        last_error = 'lease expired without a report from executor ' || COALESCE(t.executor_id, '?'),
        lease_expires_at = NULL,
        updated_at = herald.now()
    FROM lapsed l
    WHERE t.id = l.id
    RETURNING t.id, t.lease_count, t.executor_id, t.leased_at, t.state, t.account_id, t.namespace
),
recorded AS (
    INSERT INTO herald.attempts (task_id, attempt, executor_id, outcome, error, leased_at,
                                 account)
    SELECT u.id, u.lease_count, COALESCE(u.executor_id, ''), 6, 'lease expired',
           COALESCE(u.leased_at, herald.now()), u.account_id
    FROM updated u
    ON CONFLICT (task_id, attempt) DO NOTHING
)
SELECT count(*)::bigint AS expired,
       count(*) FILTER (WHERE state = 'scheduled')::bigint AS rescheduled,
       -- Slots freed per account, as '<namespace>/<account>': the lapsed leases held them.
       COALESCE(array_agg(namespace || '/' || account_id) FILTER (WHERE account_id IS NOT NULL), '{}')
           AS freed_accounts
FROM updated
