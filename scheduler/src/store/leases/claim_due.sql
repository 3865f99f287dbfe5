-- Leases up to $2 due tasks of the queue-routed route $5 ('<namespace>/'), highest priority
-- first, then earliest due: the fast path when the namespace has no accounts.
-- The placeholder below becomes one branch per priority level, highest first
-- (claim_due.at_priority.sql; see store/claim.rs for why the levels are literals). Append runs
-- the branches in order and stops once the LIMIT is met, so lower levels are only probed when
-- the higher ones run short, and each probe walks the (route, priority, run_at) index from the
-- oldest due task, or from the level's mark in $6 (lease/due_marks.rs): tasks scheduled for the
-- future are never visited however many there are.
-- SKIP LOCKED lets every replica and session claim at once without handing a task out twice.
-- herald.now() is the database clock: nothing is leased early.
-- `= ANY(ARRAY(...))` pins the update to primary-key lookups: an `UPDATE ... FROM due` join was
-- planned as a hash join over a sequential scan of the whole table (measured: 79 ms instead of
-- 10 ms per 512-task claim at 50,000 tasks).
-- A task whose send window is closed now is not leased but moved to the window's next opening
-- (herald.window_defer_to, store/tasks/functions.sql). Only tasks with a window pay for that
-- function: computing it in the probes above, even behind a CASE, doubled their cost.
-- A due task whose recipient is on the namespace's suppression list (migration 15) is ended
-- SUPPRESSED instead of leased: one primary-key probe of herald.suppressions per due task.
WITH due AS MATERIALIZED (
    SELECT due.id, due.windowed,
           EXISTS (SELECT 1 FROM herald.suppressions s
                   WHERE s.namespace = due.namespace
                     AND s.recipient = herald.recipient_key(due.recipient)) AS suppressed
    FROM ({at_each_priority}) AS due
    LIMIT $2
),
suppressed AS (
    UPDATE herald.tasks t
    SET state = 'cancelled',
        end_reason = 'suppressed',
        cancel_outcome = 1,
        last_error = 'not sent: the recipient is on the suppression list',
        finished_at = herald.now(),
        updated_at = herald.now()
    WHERE t.id = ANY(ARRAY(SELECT id FROM due WHERE suppressed))
    RETURNING t.id
),
deferred AS (
    UPDATE herald.tasks t
    SET run_at = herald.window_defer_to(t.id, t.window_start, t.window_end, t.window_zone,
                                        t.window_spread_ms, herald.now()),
        updated_at = herald.now()
    WHERE t.id = ANY(ARRAY(SELECT id FROM due WHERE windowed AND NOT suppressed))
      AND herald.window_defer_to(t.id, t.window_start, t.window_end, t.window_zone,
                                 t.window_spread_ms, herald.now()) IS NOT NULL
    RETURNING t.id
)
UPDATE herald.tasks t
SET state = 'leased',
    lease_count = t.lease_count + 1,
    executor_id = $3,
    leased_at = herald.now(),
    lease_expires_at = herald.now() + $4::bigint * interval '1 millisecond',
    updated_at = herald.now()
WHERE t.id = ANY(ARRAY(
    SELECT id FROM due
    WHERE NOT suppressed AND (NOT windowed OR id NOT IN (SELECT id FROM deferred))))
  -- Holds by the lock taken above; repeated so the update can never lease anything else. As
  -- text, so that no partial index on the state is a path for it: planned from statistics
  -- that saw few scheduled tasks, the update walked every due task instead of probing the
  -- primary key (docs/performance.md, "Plans made on an empty table").
  AND t.state::text = 'scheduled'
-- The lease columns come from store/tasks/columns.rs (LEASE_COLUMNS).
RETURNING {lease_columns}, NULL::text AS account_id, NULL::text AS credentials_ref
