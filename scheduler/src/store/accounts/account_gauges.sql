-- Every account's pacing figures for the account gauges on /metrics: the messaging tier's
-- rolling 24-hour use and limit, health, and today's count against today's cap (warm-up
-- included). One row per account; accounts are few (dozens to hundreds).
SELECT a.namespace, a.id,
       herald.tier_used(a, herald.now()) AS tier_used,
       a.tier_limit,
       herald.account_health(a) AS health,
       CASE WHEN a.day = (herald.now() AT TIME ZONE a.time_zone)::date THEN a.day_count ELSE 0 END
           AS today_count,
       (herald.account_day_cap(a, (herald.now() AT TIME ZONE a.time_zone)::date)).cap AS today_cap
FROM herald.accounts a
