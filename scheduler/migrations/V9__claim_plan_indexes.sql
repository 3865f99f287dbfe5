-- The pending-tasks index led with run_at alone, and claims could use it too: whenever the
-- statistics made a route or a priority level look as if it held every task (one pool taking
-- all the traffic, or every task at the default priority), the planner walked it for a probe of
-- an empty route or level and visited every due task to find none. Led by namespace, it still
-- serves CountTasks (which always filters by namespace) but no longer gives run_at order to a
-- claim, whose probes stay on tasks_due.
DROP INDEX herald.tasks_pending_run_at;
CREATE INDEX tasks_pending_run_at ON herald.tasks (namespace, run_at)
    WHERE state IN ('scheduled', 'leased');

-- A routed claim looks up the candidates' recipients across every account of the namespace
-- (who was sent to too recently, who is blocked). The primary key leads with the account, so
-- that lookup read every pair the namespace had ever recorded, once per claim.
CREATE INDEX recipient_sends_recipient ON herald.recipient_sends (namespace, recipient);
