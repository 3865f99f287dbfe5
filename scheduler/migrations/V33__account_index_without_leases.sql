-- tasks_account (migration 22, the console's filter by account) took an entry from the leased
-- version of every routed task: a lease is never a HOT update, and a routed lease is where a
-- pooled task first gets its account. A search by account now reads the account's leased tasks
-- through tasks_lease_expiry, which holds only leased tasks, as few as the executors' credit
-- (TASK_FILTER in store/tasks/mod.rs, delete_account.sql), so this index leaves them out and
-- every routed lease writes one index entry less (S5 in docs/performance.md).
DROP INDEX herald.tasks_account;
CREATE INDEX tasks_account ON herald.tasks (account_id, id)
    WHERE account_id IS NOT NULL AND state <> 'leased';
