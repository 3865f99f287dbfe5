-- How many tasks a filter (TASK_FILTER) selects now: a bulk operation's dry run.
SELECT count(*) AS selected FROM herald.task_records t WHERE {task_filter}
