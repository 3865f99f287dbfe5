-- tasks_recipient (migration 22, the console's search by recipient) took an entry from every
-- version of a task, the lease's too: no lease is a HOT update. A search by recipient now
-- reads the recipient's leased tasks through tasks_lease_expiry, which holds only leased tasks,
-- as few as the executors' credit (TASK_FILTER in store/tasks/mod.rs), so this index leaves
-- them out and a lease writes one index entry less (S1 in docs/performance.md).
DROP INDEX herald.tasks_recipient;
CREATE INDEX tasks_recipient ON herald.tasks (namespace, recipient, id)
    WHERE state <> 'leased';
