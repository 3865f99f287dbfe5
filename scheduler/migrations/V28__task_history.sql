-- Finished tasks leave the hot table (#18 item 4). `herald.tasks` keeps what the claim, the
-- reports and the sweeper work on: live tasks, and finished ones for a short while (the
-- history delay, when late delivery reports are most likely). After that the retention job
-- moves each finished task, with its attempts, into the history below, partitioned by the
-- task's end time, and retention drops a whole partition once it is past the retention
-- instead of deleting its rows one by one. Reads that must see every task use the views
-- `herald.task_records` and `herald.attempt_records`; a write that may meet a finished task
-- brings it back first (`herald.restore_tasks`, store/history/functions.sql).
--
-- A column added to `herald.tasks` or `herald.attempts` is added to its history table in the
-- same migration (an ALTER of the partitioned parent reaches every partition): the archive
-- and the restore copy whole rows. The views are re-created after every migration run
-- (store/history/functions.sql), so they pick the column up.

-- The attempts' history is partitioned by its task's end time, so a task and its attempts
-- leave together. Always NULL in herald.attempts; the column is there so that both tables have
-- the same row type and rows move between them whole.
ALTER TABLE herald.attempts ADD COLUMN task_finished_at timestamptz;

CREATE TABLE herald.task_history (LIKE herald.tasks INCLUDING DEFAULTS)
    PARTITION BY RANGE (finished_at);
CREATE TABLE herald.attempt_history (LIKE herald.attempts INCLUDING DEFAULTS)
    PARTITION BY RANGE (task_finished_at);

-- Only what the reads across hot and history look up by, and as few as serve them: every
-- index is written once per moved task. No partial index on the state (history rows are all
-- finished). ListTasks pages by id (task_history_id, backwards, per partition). The failure
-- list pages by end time, newest first, so tasks keep a B-tree on it (rows arrive in about
-- that order: each insert lands on the rightmost leaf); the attempts' time ranges are only
-- ever aggregated, which a BRIN index serves at next to no cost. The filters that name a
-- campaign, a schedule, an account or an audience use partial B-trees that tasks without one
-- never enter.
CREATE INDEX task_history_id ON herald.task_history (id);
CREATE INDEX task_history_finished ON herald.task_history (finished_at);
CREATE INDEX task_history_recipient ON herald.task_history (namespace, recipient, id);
CREATE INDEX task_history_campaign ON herald.task_history (campaign_id, state, run_at)
    WHERE campaign_id IS NOT NULL;
CREATE INDEX task_history_schedule ON herald.task_history (schedule_id, id)
    WHERE schedule_id IS NOT NULL;
CREATE INDEX task_history_account ON herald.task_history (account_id, id)
    WHERE account_id IS NOT NULL;
CREATE INDEX task_history_audience ON herald.task_history (namespace, audience_id, created_at)
    WHERE audience_id IS NOT NULL;
CREATE INDEX attempt_history_task ON herald.attempt_history (task_id, attempt);
CREATE INDEX attempt_history_finished ON herald.attempt_history USING brin (finished_at);

-- One row per partition pair (task_history_<n>, attempt_history_<n>): the range it holds.
-- Partitions are made and dropped under one advisory lock, so their ranges never overlap even
-- when the configured width changes between runs.
CREATE TABLE herald.history_partitions (
    lower  timestamptz PRIMARY KEY,
    upper  timestamptz NOT NULL,
    suffix text NOT NULL UNIQUE
);

-- A task moving to history deleted its guard row with it; the duplicate content guard must
-- keep seeing what was sent. Guard rows now go when their task leaves history (or is pruned).
ALTER TABLE herald.content_guard DROP CONSTRAINT content_guard_task_id_fkey;
