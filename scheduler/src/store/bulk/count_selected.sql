-- How many tasks a filter (TASK_FILTER) selects now: a bulk operation's dry run.
SELECT count(*) AS selected FROM herald.tasks t WHERE {task_filter}
