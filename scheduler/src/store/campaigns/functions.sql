-- How campaigns finish, re-applied by the migrator whenever this file changes (see
-- accounts/functions.sql). Marks active campaigns whose every task has ended as finished, and
-- raises the `campaign.finished` notification in the same transaction. A campaign that got
-- recipients in the last minute (herald's clock) is left alone, so one fed in chunks is not
-- declared finished between two chunks. Safe on every replica at once: the UPDATE re-checks
-- `state = 'active'` under its row lock, so each campaign finishes (and notifies) once.
CREATE OR REPLACE FUNCTION herald.finish_campaigns() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    c record;
    v_finished integer := 0;
BEGIN
    FOR c IN
        UPDATE herald.campaigns cp
        SET state = 'finished', updated_at = now()
        WHERE cp.state = 'active'
          AND cp.recipient_count > 0
          -- Still adding its audience's contacts (migration V23).
          AND NOT cp.audience_pending
          AND cp.updated_at < herald.now() - interval '1 minute'
          AND NOT EXISTS (SELECT 1 FROM herald.tasks t
                          WHERE t.campaign_id = cp.id AND t.state IN ('scheduled', 'leased'))
        RETURNING cp.namespace, cp.id, cp.name, cp.recipient_count
    LOOP
        PERFORM herald.notify_event('campaign.finished', jsonb_build_object(
            'campaign_id', c.id,
            'namespace', c.namespace,
            'name', c.name,
            'recipients', c.recipient_count,
            'states', (SELECT jsonb_object_agg(s.task_state, s.tasks)
                       FROM (SELECT t.state::text AS task_state, count(*) AS tasks
                             FROM herald.tasks t
                             WHERE t.campaign_id = c.id GROUP BY t.state) s)));
        v_finished := v_finished + 1;
    END LOOP;
    RETURN v_finished;
END
$$;

-- What a campaign's state means for a task of it that comes back to life after it ended (a
-- retry, a late failure tried again, a window-closed fallback): 'cancelled', it must not (the
-- campaign was stopped by hand, and nothing of it may go out any more); 'paused', it comes back
-- parked behind a 'paused:' route, as the campaign's live tasks were (resuming unparks it);
-- NULL, it may go. Pausing and cancelling touch live tasks only, so every path that brings an
-- ended task back asks this.
CREATE OR REPLACE FUNCTION herald.campaign_hold(p_campaign uuid) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT c.state::text FROM herald.campaigns c
    WHERE c.id = p_campaign AND c.state IN ('cancelled', 'paused')
$$;

-- The route a task of campaign p_campaign comes back to life on (see herald.campaign_hold):
-- parked while the campaign is paused, else its own.
CREATE OR REPLACE FUNCTION herald.revived_route(p_route text, p_campaign uuid) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN herald.campaign_hold(p_campaign) = 'paused' AND p_route NOT LIKE 'paused:%'
                THEN 'paused:' || p_route ELSE p_route END
$$;

-- Reopens the finished campaigns among p_campaigns: one of their tasks came back to life (a
-- retry, a late failure tried again, a window-closed fallback), and a finished campaign could
-- neither be paused nor cancelled, so its controls would not reach that task. Active again, it
-- finishes again (and notifies again) once its tasks have ended; updated_at keeps
-- herald.finish_campaigns from finishing it in the same minute.
CREATE OR REPLACE FUNCTION herald.reopen_campaigns(p_campaigns uuid[]) RETURNS integer
LANGUAGE sql AS $$
    WITH reopened AS (
        UPDATE herald.campaigns c
        SET state = 'active', updated_at = herald.now()
        WHERE c.id = ANY(p_campaigns) AND c.state = 'finished'
        RETURNING 1
    )
    SELECT count(*)::integer FROM reopened
$$;
