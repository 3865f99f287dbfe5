-- Checks herald.account_room (one SQL statement, inlined by the planner) against the PL/pgSQL
-- form it replaced, which account_room_equivalence.sh installs from git history as
-- herald.account_room_plpgsql: 20,000 random account rows and instants (seeded), every output
-- compared; `differ` must be 0 and the list after it empty. The other columns show the cases
-- reach every branch. Then times both over 5,000 calls. Changes nothing: it rolls back.
BEGIN;

-- Releases waiting to be folded for most of the ids the cases use (acct-000 to acct-129).
INSERT INTO herald.account_deltas (namespace, account_id, released, ok)
SELECT 'bench', format('acct-%s', lpad(i::text, 3, '0')), 1 + i % 3, 1
FROM generate_series(0, 99) i, generate_series(1, 5);

SELECT setseed(0.42);
CREATE TEMP TABLE cases AS
SELECT g AS n,
       jsonb_populate_record(NULL::herald.accounts, jsonb_build_object(
         'namespace', 'bench',
         'id', format('acct-%s', lpad((g % 130)::text, 3, '0')),
         'time_zone', (ARRAY['UTC','Asia/Shanghai','America/New_York','Europe/Berlin','Asia/Kolkata'])[1 + (g % 5)],
         'state', (ARRAY['active','paused','offline'])[1 + floor(random()*3)::int],
         'offline_until', CASE WHEN random() < 0.3 THEN NULL ELSE now() + (random()*600 - 300) * interval '1 s' END,
         'rate_per_sec', 1 + random()*100,
         'burst', CASE WHEN random() < 0.1 THEN 0 ELSE 1 + floor(random()*200)::int END,
         'daily_cap', CASE WHEN random() < 0.4 THEN NULL ELSE floor(random()*1000)::int END,
         'max_in_flight', CASE WHEN random() < 0.3 THEN NULL ELSE floor(random()*100)::int END,
         'quiet_start', CASE WHEN random() < 0.5 THEN NULL ELSE (time '00:00' + floor(random()*1440) * interval '1 min') END,
         'quiet_end', CASE WHEN random() < 0.05 THEN NULL ELSE (time '00:00' + floor(random()*1440) * interval '1 min') END,
         'high_priority_reserve', (ARRAY[0, 0.1, 0.5, 1])[1 + floor(random()*4)::int],
         'effective_rate', 0.01 + random()*100,
         'tokens', random()*50 - 10,
         'tokens_at', now() - random() * interval '10 s' + (CASE WHEN random() < 0.1 THEN interval '5 s' ELSE interval '0' END),
         'throttled_until', CASE WHEN random() < 0.5 THEN NULL ELSE now() + (random()*20 - 10) * interval '1 s' END,
         'in_flight', floor(random()*120)::int,
         'day', CASE WHEN random() < 0.2 THEN NULL ELSE current_date + floor(random()*3)::int - 1 END,
         'day_count', floor(random()*1200)::int,
         'created_at', now() - random() * interval '30 days',
         'ramp_start', CASE WHEN random() < 0.7 THEN NULL ELSE current_date + floor(random()*20)::int - 10 END,
         'ramp_initial', CASE WHEN random() < 0.6 THEN NULL ELSE floor(random()*100)::int END,
         'ramp_step', CASE WHEN random() < 0.5 THEN NULL ELSE floor(random()*50)::int END,
         'ramp_ceiling', CASE WHEN random() < 0.5 THEN NULL ELSE floor(random()*500)::int END,
         'ramp_table', CASE WHEN random() < 0.8 THEN NULL WHEN random() < 0.2 THEN '{}'::int[] ELSE ARRAY[10, 20, 50, 100] END,
         'gap_min_ms', CASE WHEN random() < 0.6 THEN NULL ELSE floor(random()*5000)::int END,
         'next_send_at', CASE WHEN random() < 0.3 THEN NULL ELSE now() + (random()*4 - 2) * interval '1 s' END,
         'tier_limit', CASE WHEN random() < 0.5 THEN NULL ELSE floor(random()*100)::int END,
         'tier_used', floor(random()*120)::int,
         'tier_counted_at', CASE WHEN random() < 0.3 THEN NULL ELSE now() - random() * interval '2 min' END
       )) AS a,
       now() + (random()*86400*2 - 86400) * interval '1 s' AS at
FROM generate_series(1, 20000) g;

SELECT count(*) AS cases,
       count(*) FILTER (WHERE old.o IS DISTINCT FROM new_.s) AS differ,
       count(*) FILTER (WHERE r.room > 0) AS with_room,
       count(*) FILTER (WHERE r.room_low > 0 AND r.room_low < r.room) AS low_below,
       count(*) FILTER (WHERE r.available_at IS NULL) AS never,
       count(*) FILTER (WHERE r.tier_recounted) AS recounted,
       count(*) FILTER (WHERE r.available_at > c.at) AS later,
       count(DISTINCT r.day_cap) AS day_caps
FROM cases c
CROSS JOIN LATERAL (SELECT x::text AS o FROM herald.account_room_plpgsql(c.a, c.at) x) old
CROSS JOIN LATERAL (SELECT x::text AS s FROM herald.account_room(c.a, c.at) x) new_
CROSS JOIN LATERAL herald.account_room_plpgsql(c.a, c.at) r;
SELECT c.n, old.o, new_.s FROM cases c
CROSS JOIN LATERAL (SELECT x::text AS o FROM herald.account_room_plpgsql(c.a, c.at) x) old
CROSS JOIN LATERAL (SELECT x::text AS s FROM herald.account_room(c.a, c.at) x) new_
WHERE old.o IS DISTINCT FROM new_.s LIMIT 5;

\timing on
SELECT sum(r.room) FROM cases c CROSS JOIN LATERAL herald.account_room_plpgsql(c.a, c.at) r
WHERE c.n <= 5000;
SELECT sum(r.room) FROM cases c CROSS JOIN LATERAL herald.account_room(c.a, c.at) r
WHERE c.n <= 5000;
\timing off
ROLLBACK;
