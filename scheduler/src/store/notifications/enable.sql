-- Keeps notifications being recorded for $1 ms from now (see herald.notify_settings, V5).
INSERT INTO herald.notify_settings (id, enabled_until)
VALUES (true, now() + $1::bigint * interval '1 millisecond')
ON CONFLICT (id) DO UPDATE SET enabled_until =
    GREATEST(herald.notify_settings.enabled_until, EXCLUDED.enabled_until)
