-- Why a run created fewer tasks than it had recipients (their tasks no longer check or render:
-- a template that now needs a variable the schedule does not supply, an account deleted), so
-- ListScheduleRuns and the console say so instead of a run that looks fired and sent nothing.
ALTER TABLE herald.schedule_runs ADD COLUMN error text;
