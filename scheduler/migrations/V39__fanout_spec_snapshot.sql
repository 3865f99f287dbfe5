-- The schedule as it was when a fan-out's run was made, so every batch of the run sends that
-- run's content to that run's recipients even when UpdateSchedule changes the schedule while
-- the run is still fanning out. NULL for fan-outs made before: they read the schedule.
ALTER TABLE herald.fanouts ADD COLUMN spec bytea;
