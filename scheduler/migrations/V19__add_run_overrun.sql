-- A schedule run still unfinished N minutes after its fire time (ScheduleSpec.overrun_after)
-- raises `schedule.run_overran`. Each run is checked once, when its deadline passes.
ALTER TABLE herald.schedule_runs
    -- When to check the run: fire time + overrun_after, from the spec when the run was created
    -- (NULL: the schedule has no overrun alert, or the run was checked).
    ADD COLUMN overrun_deadline timestamptz,
    -- When the check found it unfinished.
    ADD COLUMN overran_at timestamptz;
CREATE INDEX schedule_runs_overrun_deadline ON herald.schedule_runs (overrun_deadline)
    WHERE overrun_deadline IS NOT NULL;
