-- A campaign to an audience gets its recipients page by page in the background (an audience
-- may hold a million contacts; CreateCampaign writes the first page and answers), resuming
-- after a restart from the last contact handled. Tasks remember the audience they were made
-- for, so bulk operations and ListTasks can select by it.
ALTER TABLE herald.campaigns
    ADD COLUMN audience_pending boolean NOT NULL DEFAULT false,
    -- The last contact handled (contacts are walked by recipient).
    ADD COLUMN audience_after   text COLLATE "C" NOT NULL DEFAULT '',
    -- When a date attribute ("birthday is today") is compared.
    ADD COLUMN audience_at      timestamptz,
    -- Why adding the audience stopped early (the campaign's recipient cap, a deleted audience).
    ADD COLUMN audience_error   text;
-- The expansion loop's work list.
CREATE INDEX campaigns_audience_pending ON herald.campaigns (namespace, id) WHERE audience_pending;

ALTER TABLE herald.tasks ADD COLUMN audience_id text;
-- Selecting a namespace's tasks by audience; only tasks made from one are indexed.
CREATE INDEX tasks_audience ON herald.tasks (namespace, audience_id, created_at)
    WHERE audience_id IS NOT NULL;
