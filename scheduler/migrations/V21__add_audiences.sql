-- Audiences: named contact lists per namespace, and the fan-outs that turn one schedule run
-- into one task per matching contact, batch by batch.
CREATE TABLE herald.audiences (
    namespace         text NOT NULL,
    id                text NOT NULL,
    channel           text NOT NULL,            -- 'whatsapp' | 'wecom'
    description       text NOT NULL DEFAULT '',
    default_time_zone text NOT NULL DEFAULT 'UTC',
    -- Attributes whose values are dates (YYYY-MM-DD or MM-DD), checked on every write.
    date_attributes   text[] NOT NULL DEFAULT '{}',
    -- Kept in the transaction of every contact write, so the 1,000,000 bound and
    -- GetAudience need no count(*) over a million rows.
    contact_count     bigint NOT NULL DEFAULT 0,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, id)
);

CREATE TABLE herald.contacts (
    namespace   text NOT NULL,
    audience_id text NOT NULL,
    -- "C" collation: the primary key's index then serves recipient-prefix searches and keyset
    -- pages by plain byte order.
    recipient   text COLLATE "C" NOT NULL,
    name        text NOT NULL DEFAULT '',
    time_zone   text NOT NULL DEFAULT '',      -- '' means the audience's default
    locale      text NOT NULL DEFAULT '',
    tags        text[] NOT NULL DEFAULT '{}',
    attributes  jsonb NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, audience_id, recipient),
    FOREIGN KEY (namespace, audience_id) REFERENCES herald.audiences (namespace, id)
        ON DELETE CASCADE
);
-- Tag filters (`tags @> $1`), for searches and fan-outs.
CREATE INDEX contacts_tags ON herald.contacts USING gin (tags);

-- One row per schedule run that targets an audience: the run's contacts become tasks in
-- batches, each batch its own transaction that advances `after_recipient`, so a million
-- contacts never sit in one transaction and a crash resumes at the last committed batch.
-- Tasks are keyed by (schedule, fire time, recipient), so a batch run twice creates nothing new.
CREATE TABLE herald.fanouts (
    namespace       text NOT NULL,
    schedule_id     text NOT NULL,
    fire_time       timestamptz NOT NULL,
    catch_up        boolean NOT NULL,
    -- The run's period: the variables source is asked for it, templates may show it.
    period_start    timestamptz,
    period_end      timestamptz NOT NULL,
    -- The last contact handled (contacts are walked by recipient).
    after_recipient text COLLATE "C" NOT NULL DEFAULT '',
    tasks_created   integer NOT NULL DEFAULT 0,
    done            boolean NOT NULL DEFAULT false,
    -- Failed batches (a variables source that did not answer) wait and try again.
    failures        integer NOT NULL DEFAULT 0,
    next_try_at     timestamptz NOT NULL DEFAULT now(),
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, schedule_id, fire_time),
    FOREIGN KEY (namespace, schedule_id, fire_time)
        REFERENCES herald.schedule_runs (namespace, schedule_id, fire_time) ON DELETE CASCADE
);
-- The fan-out loop's work list.
CREATE INDEX fanouts_pending ON herald.fanouts (next_try_at) WHERE NOT done;
