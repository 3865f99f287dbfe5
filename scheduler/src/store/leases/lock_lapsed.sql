-- Takes the lapsed leases the sweep is about to end (expire_leases.sql): their rows, then the
-- locks a webhook batch takes on the tasks it names (lock_tasks.sql's keys), and returns the
-- tasks whose lock it got. A webhook batch that records a status for one of them, uncommitted
-- while the sweep reads, would otherwise be missed by both: the webhook finds the task still
-- leased, the sweep finds no status yet, and the task waits out the grace and is sent again
-- although its message went out. A task whose lock a webhook or report batch holds is left to
-- a later sweep (its walk from the oldest entry finds it): tried, not waited for, since a
-- report batch takes that lock before the row this statement holds.
-- The walk of tasks_lease_expiry starts at $2 (the sweeper's low-water mark, src/low_water.rs;
-- NULL: the oldest entry). SKIP LOCKED makes concurrent sweepers on several replicas safe.
SELECT coalesce(array_agg(l.id) FILTER (WHERE pg_try_advisory_xact_lock(l.k)), '{}') AS ids
FROM (
    SELECT t.id, hashtextextended(t.namespace || ':task:' || t.id::text, 0) AS k
    FROM (
        SELECT t.id, t.namespace
        FROM herald.tasks t
        WHERE t.state = 'leased' AND t.lease_expires_at <= herald.now()
          AND t.lease_expires_at >= coalesce($2::timestamptz, '-infinity')
        ORDER BY t.lease_expires_at
        LIMIT $1
        FOR UPDATE OF t SKIP LOCKED
    ) t
    ORDER BY k
) l
