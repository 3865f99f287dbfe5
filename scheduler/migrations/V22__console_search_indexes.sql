-- The console's task search (store/tasks/list_tasks.sql) pages newest first within one
-- recipient, account or schedule; without these a search for a recipient with no tasks would
-- walk the whole namespace. Campaigns are served by tasks_campaign, schedules by
-- tasks_schedule_id (migration V18), ids by the primary key.
CREATE INDEX tasks_recipient ON herald.tasks (namespace, recipient, id);
CREATE INDEX tasks_account ON herald.tasks (account_id, id) WHERE account_id IS NOT NULL;
