-- Every update of a task that names an account wrote an entry into two indexes on account_id:
-- tasks_account (the console's filter, migration 22) and tasks_account_live (live tasks by
-- account, migration 2). A state change is never a HOT update here, so a routed claim's lease
-- and each report paid for both (docs/performance.md, S5). tasks_account serves what the live
-- index did: deleting an account counts its live tasks through it, and the reconciler now
-- counts leased tasks for every account in one pass over tasks_lease_expiry, which holds only
-- the leased ones (drifted_accounts.sql, reconcile_in_flight.sql).
DROP INDEX herald.tasks_account_live;
