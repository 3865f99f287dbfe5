-- The console's task search (store/tasks/list_tasks.sql) pages newest first within one
-- recipient, account or schedule; without these a search for a recipient with no tasks would
-- walk the whole namespace. Campaigns are served by tasks_campaign, ids by the primary key.
CREATE INDEX tasks_recipient ON herald.tasks (namespace, recipient, id);
CREATE INDEX tasks_account ON herald.tasks (account_id, id) WHERE account_id IS NOT NULL;
CREATE INDEX tasks_schedule ON herald.tasks (schedule_id, id) WHERE schedule_id IS NOT NULL;
