-- The notification outbox: events for the operator's webhook (HERALD_NOTIFY_URL), written by
-- triggers in the very transaction that makes the change, so a crash between the change and
-- the delivery loses nothing. The delivery loop (scheduler/src/telemetry/notify.rs) sends them
-- with retries and deletes each one once delivered.
CREATE TABLE herald.notifications (
    -- Also the `webhook-id` of every delivery attempt, so receivers can drop repeats.
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    event           text NOT NULL,
    payload         jsonb NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_error      text
);
CREATE INDEX notifications_due ON herald.notifications (next_attempt_at);

-- Whether anyone delivers notifications. A replica with a notify URL pushes `enabled_until`
-- forward while it runs; when none does, the triggers stop recording (after a few minutes),
-- so an installation without the webhook does not grow a table nobody drains.
CREATE TABLE herald.notify_settings (
    id            boolean PRIMARY KEY DEFAULT true CHECK (id),
    enabled_until timestamptz NOT NULL
);

-- The one way to record a notification; also the hook for events raised elsewhere (a campaign
-- finishing calls `herald.notify_event('campaign.finished', ...)` in its own transaction).
CREATE FUNCTION herald.notify_event(p_event text, p_data jsonb) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM herald.notify_settings WHERE enabled_until > now()) THEN
        INSERT INTO herald.notifications (event, payload)
        VALUES (p_event, jsonb_build_object(
            'type', p_event,
            'timestamp', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
            'data', p_data));
    END IF;
END $$;

-- A task ending FAILED or EXPIRED, whichever statement does it (a report, the sweeper).
CREATE FUNCTION herald.notify_task_ended() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM herald.notify_event('task.' || NEW.state::text, jsonb_build_object(
        'task_id', NEW.id,
        'namespace', NEW.namespace,
        'queue', NEW.queue,
        'state', upper(NEW.state::text),
        'attempts', NEW.attempts,
        'account_id', NEW.account_id,
        'labels', NEW.labels,
        'last_error', NEW.last_error));
    RETURN NULL;
END $$;

CREATE TRIGGER tasks_notify_ended
    AFTER UPDATE OF state ON herald.tasks
    FOR EACH ROW
    WHEN (NEW.state IN ('failed', 'expired') AND OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION herald.notify_task_ended();

-- An account going offline (the provider said it is unavailable), not one already offline.
CREATE FUNCTION herald.notify_account_offline() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM herald.notify_event('account.offline', jsonb_build_object(
        'namespace', NEW.namespace,
        'account_id', NEW.id,
        'pool', NEW.pool,
        'reason', NEW.state_reason,
        'offline_until', NEW.offline_until));
    RETURN NULL;
END $$;

CREATE TRIGGER accounts_notify_offline
    AFTER UPDATE OF state ON herald.accounts
    FOR EACH ROW
    WHEN (NEW.state = 'offline' AND OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION herald.notify_account_offline();
