-- Recurring schedules with their materialised runs, and campaigns. Tasks gain links to the
-- schedule run or campaign that created them.
CREATE TABLE herald.schedules (
    namespace        text NOT NULL,
    id               text NOT NULL,
    cron             text NOT NULL,
    time_zone        text NOT NULL,
    skipped_time     text NOT NULL,          -- 'shift_forward' | 'skip'
    repeated_time    text NOT NULL,          -- 'fire_once' | 'fire_twice'
    overlap          text NOT NULL,          -- 'skip' | 'allow'
    misfire          text NOT NULL,          -- 'skip' | 'fire_once_now' | 'catch_up'
    misfire_grace_ms bigint NOT NULL,
    jitter_ms        bigint NOT NULL DEFAULT 0,
    stagger_ms       bigint NOT NULL DEFAULT 0,
    stagger_off_round boolean NOT NULL DEFAULT false,
    -- herald.v1.ScheduleSpec, prost-encoded: the task template (queue, recipients, content, ...).
    spec             bytea NOT NULL,
    paused           boolean NOT NULL DEFAULT false,
    -- The materialiser's cursor: the earliest fire time not yet handled (NULL: never fires
    -- again). Advanced in the same transaction that inserts the runs before it.
    next_fire_at     timestamptz,
    last_fire_at     timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, id)
);
-- The materialiser's wake-up: the earliest cursor of an active schedule.
CREATE INDEX schedules_next_fire ON herald.schedules (next_fire_at) WHERE NOT paused;

CREATE TABLE herald.schedule_runs (
    namespace   text NOT NULL,
    schedule_id text NOT NULL,
    fire_time   timestamptz NOT NULL,
    -- 'fired', 'catch_up' (a missed run fired late), 'skipped_overlap'.
    kind        text NOT NULL,
    task_count  integer NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    -- Materialising is idempotent on (schedule, fire time).
    PRIMARY KEY (namespace, schedule_id, fire_time),
    FOREIGN KEY (namespace, schedule_id) REFERENCES herald.schedules (namespace, id)
        ON DELETE CASCADE
);

CREATE TYPE herald.campaign_state AS ENUM ('active', 'paused', 'cancelled', 'finished');

CREATE TABLE herald.campaigns (
    namespace       text NOT NULL,
    id              uuid NOT NULL,
    name            text NOT NULL DEFAULT '',
    state           herald.campaign_state NOT NULL DEFAULT 'active',
    -- herald.v1.CampaignSpec, prost-encoded (content, window, spread, target).
    spec            bytea NOT NULL,
    pool            text,
    -- Recipients accepted so far (duplicates dropped): the sequence number spacing uses.
    recipient_count integer NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, id)
);

ALTER TABLE herald.tasks
    ADD COLUMN schedule_id text,
    ADD COLUMN fire_time timestamptz,
    ADD COLUMN campaign_id uuid;
-- Overlap: is the previous run of a schedule unfinished? Only live tasks are indexed.
CREATE INDEX tasks_schedule_live ON herald.tasks (schedule_id, fire_time)
    WHERE schedule_id IS NOT NULL AND state IN ('scheduled', 'leased');
-- Campaign progress is one GROUP BY over this index (index-only: no heap visits), and pause,
-- resume and cancel find a campaign's tasks through it.
CREATE INDEX tasks_campaign ON herald.tasks (campaign_id, state, run_at)
    WHERE campaign_id IS NOT NULL;
-- Duplicates within a campaign are dropped by this key.
CREATE UNIQUE INDEX tasks_campaign_recipient ON herald.tasks (campaign_id, recipient)
    WHERE campaign_id IS NOT NULL;
