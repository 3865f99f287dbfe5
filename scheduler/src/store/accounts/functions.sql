-- The account limit functions: the one definition of every per-account limit, and how claims
-- reserve capacity and reports feed back. Applied by the migrator after the numbered
-- migrations whenever this file changes (CREATE OR REPLACE, in the migration transaction), so
-- a limit is changed here, in place, instead of restating these bodies in a new migration.
-- A change to a function's signature must DROP the old one first.

DROP FUNCTION IF EXISTS herald.account_room(herald.accounts, timestamptz);
DROP FUNCTION IF EXISTS herald.reserve_capacity(text, text[], integer[], integer[], timestamptz);
DROP FUNCTION IF EXISTS herald.reserve_capacity(text, text[], integer[], integer[], integer[],
    timestamptz);
DROP FUNCTION IF EXISTS herald.account_feedback(text, text[], integer[], integer[], integer[],
    integer[], bigint[], integer[], text[], timestamptz);
-- Dropped whenever this file is applied, so its result may change (out_paced went when
-- every routed lease began to take its grant instant).
DROP FUNCTION IF EXISTS herald.grant_claim(text, uuid[], text[], boolean[], boolean[], text[],
    text[]);

-- How far ahead a claim plans an account's paced sends (human-like gaps): the sends it grants
-- fall at drawn instants from now to now plus this, and the executor holds each until its
-- instant (the lease's send_after). Short, so a pause or a cancel still stops most of what is
-- planned, and long enough that fast gaps are not limited to one send per claim.
CREATE OR REPLACE FUNCTION herald.pacing_horizon() RETURNS interval
LANGUAGE sql IMMUTABLE AS $$ SELECT interval '1 second' $$;

-- One human-like gap for account a: its minimum plus a uniform random part up to its maximum.
CREATE OR REPLACE FUNCTION herald.draw_gap(a herald.accounts) RETURNS interval
LANGUAGE sql VOLATILE AS $$
    SELECT (a.gap_min_ms + floor(random() * (greatest(coalesce(a.gap_max_ms, a.gap_min_ms)
                                                     - a.gap_min_ms, 0) + 1)))
           * interval '1 millisecond'
$$;

-- An account's daily cap on local day p_day: the configured daily_cap, lowered by the warm-up
-- ramp while it lasts. ramp_day is the day of the ramp (1 on its start, which is the day the
-- account was created unless set), NULL without a ramp; before the ramp starts the cap is 0.
CREATE OR REPLACE FUNCTION herald.account_day_cap(
    a herald.accounts, p_day date, OUT cap integer, OUT ramp_day integer
) LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_ramp bigint;
BEGIN
    cap := a.daily_cap;
    IF a.ramp_initial IS NULL AND a.ramp_table IS NULL THEN
        RETURN;
    END IF;
    ramp_day := p_day - coalesce(a.ramp_start, (a.created_at AT TIME ZONE a.time_zone)::date) + 1;
    IF ramp_day < 1 THEN
        cap := 0;
        RETURN;
    END IF;
    IF cardinality(a.ramp_table) > 0 THEN
        v_ramp := a.ramp_table[least(ramp_day, cardinality(a.ramp_table))];
    ELSE
        v_ramp := least(coalesce(a.ramp_ceiling, 2147483647)::bigint,
                        a.ramp_initial + (ramp_day - 1)::bigint * coalesce(a.ramp_step, 0));
    END IF;
    cap := least(coalesce(a.daily_cap, 2147483647)::bigint, v_ramp)::integer;
END
$$;

-- Business-initiated conversations the account opened in the 24 hours before p_now: what its
-- messaging tier caps. The one count of it (account_room, GetAccount and the gauges use it).
CREATE OR REPLACE FUNCTION herald.tier_used(a herald.accounts, p_now timestamptz)
RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT count(*)::integer FROM herald.recipient_sends s
    WHERE s.namespace = a.namespace AND s.account_id = a.id
      AND s.opened_at > p_now - interval '24 hours'
$$;

-- How healthy an account looks from recent outcomes, 0 to 1: its recent success rate, lowered
-- while the adaptive rate is below the configured one (the provider is throttling it) and by
-- the provider's quality rating. Routing prefers healthier accounts.
CREATE OR REPLACE FUNCTION herald.account_health(a herald.accounts) RETURNS double precision
LANGUAGE sql STABLE AS $$
    SELECT a.success_ewma
           * (0.5 + 0.5 * least(1.0, a.effective_rate / a.rate_per_sec))
           * CASE a.quality WHEN 'red' THEN 0.3 WHEN 'yellow' THEN 0.7 ELSE 1.0 END
$$;

-- An account's in-flight count: the slots its row holds less those released by reports and
-- still waiting in herald.account_deltas to be folded into it. What every limit and read uses
-- (account_room writes the same sum out, so that the planner can inline it).
CREATE OR REPLACE FUNCTION herald.account_in_flight(a herald.accounts) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT a.in_flight - coalesce((SELECT sum(d.released) FROM herald.account_deltas d
                                   WHERE d.namespace = a.namespace AND d.account_id = a.id),
                                  0)::integer
$$;

-- How much an account may send at p_now: the single definition of every limit, used both to
-- plan a claim and to reserve capacity. `room` is what any task may take, `room_low` what a task
-- below high_priority_min may take (the rest of the in-flight slots are kept for high
-- priority), `tier_room` how many of them may open a new business-initiated conversation (the
-- messaging tier; sends inside an open conversation or customer-service window are free).
-- When room is 0, `available_at` says when time alone will open it again (NULL when only an
-- event will: the account is paused, or every in-flight slot is taken). `day_cap` is today's
-- cap (warm-up included); `tier_used` the rolling 24-hour count, recounted (`tier_recounted`)
-- when the stored one is more than a minute old, since conversations age out one by one.
--
-- One SQL statement, so that the planner inlines it into the claim's budgets and the
-- reservation: as a PL/pgSQL function each call cost 25-45 us per account (each of its thirty
-- expressions checked and run alone, and account_in_flight started an executor of its own),
-- twice per account per routed claim; inlined, 3-5 us (docs/performance.md, S5). The in-flight
-- count is account_in_flight's, written out for the same reason. The OFFSET 0 fences keep each
-- value computed once per account instead of copied into every expression that uses it.
-- bench/experiments/account_room_equivalence.sh checks it against the PL/pgSQL form.
CREATE OR REPLACE FUNCTION herald.account_room(
    a herald.accounts, p_now timestamptz
) RETURNS TABLE (
    room integer, room_low integer, tokens double precision, day_used integer, reopen boolean,
    available_at timestamptz, day_cap integer, tier_room integer, tier_used integer,
    tier_recounted boolean
) LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN s.available_at IS DISTINCT FROM p_now THEN 0 ELSE greatest(c.room, 0) END,
           CASE WHEN s.available_at IS DISTINCT FROM p_now THEN 0
                ELSE greatest(least(c.room, coalesce(floor(a.max_in_flight
                                                           * (1 - a.high_priority_reserve))::integer
                                                     - b.in_flight, 2147483647)), 0) END,
           b.tokens, b.day_used, b.reopen, s.available_at, b.day_cap,
           CASE WHEN a.tier_limit IS NULL THEN 2147483647
                ELSE greatest(a.tier_limit - t.tier_used, 0) END,
           t.tier_used, t.recount
    FROM (
        SELECT l.local, l.in_flight,
               CASE WHEN a.ramp_initial IS NULL AND a.ramp_table IS NULL THEN a.daily_cap
                    ELSE (herald.account_day_cap(a, l.local::date)).cap END AS day_cap,
               least(a.burst::double precision,
                     a.tokens + greatest(extract(epoch FROM p_now - a.tokens_at), 0)
                                * a.effective_rate) AS tokens,
               CASE WHEN a.day = l.local::date THEN a.day_count ELSE 0 END AS day_used,
               a.state = 'offline' AND a.offline_until <= p_now AS reopen,
               CASE WHEN a.quiet_start IS NULL THEN false
                    WHEN a.quiet_start <= a.quiet_end
                    THEN l.local::time >= a.quiet_start AND l.local::time < a.quiet_end
                    ELSE l.local::time >= a.quiet_start OR l.local::time < a.quiet_end
               END AS quiet
        FROM (SELECT p_now AT TIME ZONE a.time_zone AS local,
                     a.in_flight - coalesce((SELECT sum(d.released) FROM herald.account_deltas d
                                            WHERE d.namespace = a.namespace
                                              AND d.account_id = a.id), 0)::integer
                         AS in_flight OFFSET 0) l
        OFFSET 0
    ) b
    CROSS JOIN LATERAL (
        SELECT coalesce(a.tier_limit IS NOT NULL
                        AND (a.tier_counted_at IS NULL
                             OR a.tier_counted_at <= p_now - interval '1 minute'), false)
               AS recount
    ) r
    CROSS JOIN LATERAL (
        SELECT r.recount,
               CASE WHEN r.recount THEN herald.tier_used(a, p_now) ELSE a.tier_used END AS tier_used
    ) t
    CROSS JOIN LATERAL (
        SELECT CASE WHEN a.gap_min_ms IS NULL THEN c0.room
                    ELSE least(c0.room, 1 + floor(extract(epoch FROM herald.pacing_horizon()) * 1000
                                                  / greatest(a.gap_min_ms, 1))::integer) END AS room
        FROM (SELECT least(floor(b.tokens)::integer,
                           coalesce(b.day_cap - b.day_used, 2147483647),
                           coalesce(a.max_in_flight - b.in_flight, 2147483647)) AS room) c0
    ) c
    -- When time alone gives room again: each limit that holds pushes it later (greatest skips
    -- a NULL, as the steps of the PL/pgSQL original did); a full in-flight cap, only an event.
    CROSS JOIN LATERAL (
        SELECT CASE WHEN a.max_in_flight IS NOT NULL AND b.in_flight >= a.max_in_flight THEN NULL
                    ELSE greatest(
                        CASE WHEN a.state = 'paused' THEN NULL ELSE p_now END,
                        CASE WHEN a.state = 'offline' AND NOT b.reopen THEN a.offline_until END,
                        CASE WHEN a.throttled_until > p_now THEN a.throttled_until END,
                        CASE WHEN b.quiet
                             THEN (b.local::date + a.quiet_end
                                   + CASE WHEN b.local::time >= a.quiet_end THEN interval '1 day'
                                          ELSE interval '0' END) AT TIME ZONE a.time_zone END,
                        CASE WHEN b.tokens < 1
                             THEN p_now + (1 - b.tokens) / a.effective_rate
                                          * interval '1 second' END,
                        CASE WHEN a.gap_min_ms IS NOT NULL AND a.next_send_at > p_now
                             THEN a.next_send_at END,
                        CASE WHEN b.day_cap IS NOT NULL AND b.day_used >= b.day_cap
                             THEN (b.local::date + 1)::timestamp AT TIME ZONE a.time_zone END)
               END AS available_at
        OFFSET 0
    ) s
    -- Once per account even where the caller uses a result several times (inlined, the
    -- reservation would otherwise compute each result again for every use).
    OFFSET 0
$$;

-- The instants an account with human-like gaps grants `wanted` sends at, from p_now (room is
-- granted only once next_send_at has passed, so the first send is now), each a drawn gap after
-- the one before while it falls within the pacing horizon, and where its next send may fall.
-- None falls in the account's quiet hours or on its next local day: the room was read at
-- p_now, and a send planned past either would go in quiet hours, or count against today's cap
-- while it went tomorrow. NULL times (and next) when nothing is wanted.
CREATE OR REPLACE FUNCTION herald.paced_instants(
    a herald.accounts, p_now timestamptz, wanted integer,
    OUT times timestamptz[], OUT next timestamptz
) LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_local timestamp;
    v_before timestamptz;
BEGIN
    IF wanted <= 0 THEN
        RETURN;
    END IF;
    v_local := p_now AT TIME ZONE a.time_zone;
    -- least() skips the NULL of an account without quiet hours.
    v_before := least((v_local::date + 1)::timestamp AT TIME ZONE a.time_zone,
                      (v_local::date + a.quiet_start
                       + CASE WHEN v_local::time >= a.quiet_start THEN interval '1 day'
                              ELSE interval '0' END) AT TIME ZONE a.time_zone);
    times := ARRAY[p_now];
    next := p_now + herald.draw_gap(a);
    WHILE cardinality(times) < wanted AND next <= p_now + herald.pacing_horizon()
          AND next < v_before LOOP
        times := times || next;
        next := next + herald.draw_gap(a);
    END LOOP;
END
$$;

-- Locks accounts p_ids of p_namespace for update, in id order byte by byte (COLLATE "C"),
-- whatever order p_ids is in and whatever the database's collation: every transaction that
-- locks several account rows takes them in that one order, so none deadlock. Sorted here
-- rather than by each caller, so that no caller can get the order wrong (a grant sorted by a
-- linguistic collation once deadlocked with report batches sorted byte by byte). The nested
-- loop is driven by the sorted ids. A statement of its own, so that the caller's next
-- statement takes its snapshot once every lock is held and reads each row as it now is.
CREATE OR REPLACE FUNCTION herald.lock_accounts(p_namespace text, p_ids text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1
    FROM (SELECT d.id
          FROM (SELECT DISTINCT w.id FROM unnest(p_ids) AS w(id)) d
          ORDER BY d.id COLLATE "C") AS u
    CROSS JOIN LATERAL (
        SELECT 1 FROM herald.accounts a
        WHERE a.namespace = p_namespace AND a.id = u.id
        FOR UPDATE
    ) l;
END
$$;

-- Reserves capacity on accounts for a claim, atomically per account row: each account grants at
-- most its account_room at p_now and records what it granted. Concurrent claims on other
-- sessions or replicas serialise on the account row, so together they can never grant more
-- than the limits. Time is read after the row lock is taken (herald.clock(), not the
-- transaction's start), so reservations on one account happen in clock order and the bucket's
-- clock never runs backwards; tests pass p_now to drive the clock (across midnight, say).
-- out_at is the reservation's time: the lease's grant time. p_new counts the tasks that would
-- open a new conversation (the messaging tier); out_new how many of them may. An account with
-- human-like gaps grants its sends at drawn instants from out_at to out_at plus the pacing
-- horizon, each a gap after the one before (out_times, one per granted send; NULL for other
-- accounts), and its next_send_at moves a gap past the last.
CREATE OR REPLACE FUNCTION herald.reserve_capacity(
    p_namespace text, p_ids text[], p_high integer[], p_low integer[], p_new integer[],
    p_now timestamptz DEFAULT NULL
) RETURNS TABLE (out_account text, out_high integer, out_low integer, out_new integer,
                 out_at timestamptz, out_times timestamptz[])
LANGUAGE plpgsql AS $$
BEGIN
    -- One statement for every account of the claim: a row-at-a-time loop cost about 0.2 ms per
    -- account per claim, and a claim through a pool reserves on each of its accounts
    -- (docs/performance.md, S5). herald.lock_accounts takes the rows in id order byte by byte,
    -- as report batches and folds take them, so concurrent claims and reports never deadlock;
    -- the arrays need only agree with each other. PL/pgSQL rather than SQL so that the
    -- statement's plan is kept across calls: a SQL function's body is planned again at every
    -- call, and with account_room inlined that planning cost more than the reservation itself.
    --
    -- The rows are locked first (herald.lock_accounts), and read and updated by the next
    -- statement, which takes its snapshot once every lock is held and so sees each row as it
    -- now is. Locked inside the statement that updates them, a row another claim or a fold had
    -- changed since that statement began was re-checked by EvalPlanQual, which starts a copy of
    -- every CTE's plan below: a twentieth of PostgreSQL's CPU in S5 (docs/performance.md).
    PERFORM herald.lock_accounts(p_namespace, p_ids);

    RETURN QUERY
    WITH locked AS (
        SELECT w.high, w.low, w.new, l.a, l.row_tid,
               greatest(coalesce(p_now, herald.clock()), (l.a).tokens_at) AS now
        FROM unnest(p_ids, p_high, p_low, p_new) AS w(id, high, low, new)
        CROSS JOIN LATERAL (
            SELECT a, a.ctid AS row_tid FROM herald.accounts a
            WHERE a.namespace = p_namespace AND a.id = w.id
        ) l
    ),
    roomed AS (
        SELECT k.*, r.room, r.tier_room, r.tier_used, r.tier_recounted, r.tokens, r.day_used,
               r.reopen, greatest(0, least(k.low, r.room_low)) AS low_granted
        FROM locked k
        CROSS JOIN LATERAL herald.account_room(k.a, k.now) r
    ),
    planned AS (
        SELECT m.*, g.times, coalesce(g.next, (m.a).next_send_at) AS next_send_at,
               -- Fewer paced instants than room: high priority keeps its sends first.
               CASE WHEN g.times IS NULL THEN m.high_granted
                    ELSE least(m.high_granted, cardinality(g.times)) END AS high_final,
               CASE WHEN g.times IS NULL THEN m.low_granted
                    ELSE cardinality(g.times) - least(m.high_granted, cardinality(g.times))
                    END AS low_final
        FROM (
            SELECT r.*, greatest(0, least(r.high, r.room - r.low_granted)) AS high_granted
            FROM roomed r
        ) m
        -- Only an account with human-like gaps draws instants. The filter refers to the outer
        -- row alone, so it gates the call (a one-time filter per account): called for every
        -- account, this PL/pgSQL function was about a tenth of the reservation of 100 accounts
        -- without gaps, which returned at once (docs/performance.md, S5). An account without
        -- gaps gets NULL times and next, as the call gave it.
        LEFT JOIN LATERAL (
            SELECT p.times, p.next
            FROM herald.paced_instants(m.a, m.now, m.high_granted + m.low_granted) p
            WHERE (m.a).gap_min_ms IS NOT NULL
            OFFSET 0
        ) g ON true
    ),
    updated AS (
        UPDATE herald.accounts acc SET
            next_send_at = p.next_send_at,
            tier_used = p.tier_used + greatest(0, least(coalesce(p.new, 0), p.tier_room,
                                                        p.high_final + p.low_final)),
            tier_counted_at = CASE WHEN p.tier_recounted THEN p.now
                                   ELSE acc.tier_counted_at END,
            tokens = p.tokens - (p.high_final + p.low_final),
            tokens_at = p.now,
            in_flight = acc.in_flight + p.high_final + p.low_final,
            day = (p.now AT TIME ZONE acc.time_zone)::date,
            day_count = p.day_used + p.high_final + p.low_final,
            state = CASE WHEN p.reopen THEN 'active'::herald.account_state ELSE acc.state END,
            state_reason = CASE WHEN p.reopen THEN 'offline cool-down over'
                                ELSE acc.state_reason END
        FROM planned p
        -- Each row found by the address `locked` read it at: the row is locked since
        -- lock_accounts, so that version is the current one. Joined by id instead, the planner
        -- (sure of one planned row) walked every account of the namespace for each account
        -- reserved, accounts squared per claim (docs/performance.md, S5).
        WHERE acc.ctid = p.row_tid AND acc.namespace = p_namespace AND acc.id = (p.a).id
        RETURNING acc.id, p.high_final, p.low_final,
                  greatest(0, least(coalesce(p.new, 0), p.tier_room,
                                    p.high_final + p.low_final)) AS new_granted,
                  p.now, p.times
    )
    SELECT * FROM updated;
END
$$;

-- Grants a routed claim's assignments in one call, after routing chose their accounts: the
-- reservation (herald.reserve_capacity), the recipient marks and the slots given back, which
-- were four round trips with the account rows locked across all of them (docs/performance.md,
-- S5). Inputs are the assignments in the order routing made them, one array element each: task
-- id, account (NULL: sent by queue), whether it is high priority, whether it opens a new
-- conversation, its recipient; p_tracked lists the accounts that record sends per recipient
-- (spacing, the messaging tier, a sticky pool).
--
-- Each account grants at most its room: assignments take its high or low slots in order, and
-- one that would open a conversation beyond the tier's room gives its slot back. Kept sends on
-- tracked accounts are recorded in recipient_sends at their grant instants (one per pair, the
-- first in order); a pair a concurrent claim just took is refused and every assignment to it is
-- dropped, its slot given back. Returns the kept assignments with their grant instants: the
-- account's reservation instant or, for an account with human-like gaps, the next of its paced
-- instants in order (an instant of a send dropped for its recipient stays unused); NULL for
-- assignments sent by queue.
CREATE OR REPLACE FUNCTION herald.grant_claim(
    p_namespace text, p_ids uuid[], p_accounts text[], p_high boolean[], p_opens boolean[],
    p_recipients text[], p_tracked text[]
) RETURNS TABLE (out_id uuid, out_account text, out_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    v_kept_ids uuid[];
    v_kept_accounts text[];
    v_kept_at timestamptz[];
    v_released text[];
BEGIN
    WITH assigned AS (
        -- A pair is keyed by herald.recipient_key (no leading '+', migration 35), as the
        -- suppression list compares recipients: one number spelled both ways is one pair.
        SELECT a.id, a.account, a.high, a.opens, herald.recipient_key(a.recipient) AS recipient,
               a.ord,
               tr.account IS NOT NULL AS tracked
        FROM unnest(p_ids, p_accounts, p_high, p_opens, p_recipients)
            WITH ORDINALITY AS a(id, account, high, opens, recipient, ord)
        -- A hash join, not `account = ANY(p_tracked)` per assignment: with a parameter for an
        -- array the test walks it element by element (500 assignments by 100 accounts).
        LEFT JOIN (SELECT DISTINCT u.account FROM unnest(p_tracked) AS u(account)) tr
            ON tr.account = a.account
    ),
    -- What each account is asked for.
    asked AS (
        SELECT a.account, (count(*) FILTER (WHERE a.high))::integer AS high,
               (count(*) FILTER (WHERE NOT a.high))::integer AS low,
               (count(*) FILTER (WHERE a.opens))::integer AS new
        FROM assigned a
        WHERE a.account IS NOT NULL
        GROUP BY a.account
    ),
    -- One element per account, every array in the same order. The reservation locks the rows
    -- byte by byte itself (herald.lock_accounts); the arrays are sorted the same way here only
    -- so that they agree with each other.
    wanted AS (
        SELECT array_agg(w.account ORDER BY w.account COLLATE "C") AS ids,
               array_agg(w.high ORDER BY w.account COLLATE "C") AS high,
               array_agg(w.low ORDER BY w.account COLLATE "C") AS low,
               array_agg(w.new ORDER BY w.account COLLATE "C") AS new
        FROM asked w
    ),
    reserved AS MATERIALIZED (
        SELECT r.*,
               -- Granted all it was asked, at one instant: every assignment keeps its slot.
               (r.out_high = k.high AND r.out_low = k.low AND r.out_new >= k.new
                AND coalesce(cardinality(r.out_times), 0) = 0) AS whole
        FROM wanted w
        CROSS JOIN LATERAL herald.reserve_capacity(p_namespace, w.ids, w.high, w.low, w.new) r
        JOIN asked k ON k.account = r.out_account
        WHERE w.ids IS NOT NULL
    ),
    joined AS (
        SELECT a.*, r.out_high, r.out_low, r.out_new, r.out_at, r.out_times,
               a.account IS NULL OR r.whole AS whole
        FROM assigned a
        LEFT JOIN reserved r ON r.out_account = a.account
    ),
    -- Routing plans within the room it read, so an account is usually granted all it was
    -- asked: those assignments keep their slots at the reservation's instant without the
    -- window passes below, which hand out the slots of the others in assignment order (three
    -- sorts of the claim: about a sixth of the grant, docs/performance.md, S5).
    timed AS (
        SELECT j.id, j.account, j.opens, j.recipient, j.ord, j.tracked,
               true AS slot, true AS kept, j.out_at AS at
        FROM joined j
        WHERE j.whole
        UNION ALL
        -- The kept sends' instants, handed out in order.
        SELECT t.id, t.account, t.opens, t.recipient, t.ord, t.tracked, t.slot, t.kept,
               CASE WHEN NOT t.kept THEN NULL
                    WHEN cardinality(t.out_times) > 0
                    THEN t.out_times[least(row_number() OVER (PARTITION BY t.account, t.kept
                                                              ORDER BY t.ord),
                                           cardinality(t.out_times))]
                    ELSE t.out_at END AS at
        FROM (
            -- A recipient whose opening send found no tier room gets nothing through the
            -- account: routing marks only a pair's first assignment as opening, so a second
            -- one kept would open the conversation past the tier, uncounted.
            SELECT o.*,
                   o.may AND coalesce(bool_and(o.may) FILTER (WHERE o.opens)
                                          OVER (PARTITION BY o.account, o.recipient), true)
                       AS kept
            FROM (
            -- Of those with a slot that open a conversation, the first out_new may.
            SELECT s.*,
                   s.slot AND (NOT s.opens
                               OR row_number() OVER (PARTITION BY s.account, s.slot AND s.opens
                                                     ORDER BY s.ord) <= s.out_new) AS may
            FROM (
                -- A slot of its class (high or low), in assignment order.
                SELECT j.*,
                       row_number() OVER (PARTITION BY j.account, j.high ORDER BY j.ord)
                       <= coalesce(CASE WHEN j.high THEN j.out_high ELSE j.out_low END, 0)
                       AS slot
                FROM joined j
                WHERE NOT j.whole
            ) s
            ) o
        ) t
    ),
    -- The recipient marks: a pair whose last send is too recent (or which
    -- the provider blocked) is not updated and not returned. A concurrent claim inserting the
    -- same pair waits for ours to commit, then finds the fresh row and is refused the same way.
    marked AS (
        INSERT INTO herald.recipient_sends AS s (namespace, account_id, recipient, last_sent_at,
                                                 opened_at)
        SELECT DISTINCT ON (t.account, t.recipient)
               p_namespace, t.account, t.recipient, t.at, CASE WHEN t.opens THEN t.at END
        FROM timed t
        WHERE t.kept AND t.tracked
        ORDER BY t.account, t.recipient, t.ord
        ON CONFLICT (namespace, account_id, recipient) DO UPDATE
        SET last_sent_at = EXCLUDED.last_sent_at,
            opened_at = COALESCE(EXCLUDED.opened_at, s.opened_at)
        WHERE (s.blocked_until IS NULL OR s.blocked_until <= EXCLUDED.last_sent_at)
          AND s.last_sent_at <= EXCLUDED.last_sent_at - COALESCE(
                (SELECT a.recipient_interval_ms FROM herald.accounts a
                 WHERE a.namespace = s.namespace AND a.id = s.account_id), 0)
              * interval '1 millisecond'
        RETURNING s.account_id, s.recipient
    ),
    decided AS (
        SELECT t.id, t.account, t.at, t.ord,
               t.kept AND (NOT t.tracked OR m.account_id IS NOT NULL) AS leased,
               -- A slot taken and not used: no tier room, or the recipient was refused.
               t.slot AND t.account IS NOT NULL AS had_slot
        FROM timed t
        -- A join, not a probe per row: marked holds one row per pair.
        LEFT JOIN marked m ON m.account_id = t.account AND m.recipient = t.recipient
    )
    -- Sorted once here rather than by each aggregate (each ORDER BY in an aggregate sorts its
    -- own input); an aggregate takes its rows in its input's order.
    SELECT array_agg(d.id) FILTER (WHERE d.leased),
           array_agg(d.account) FILTER (WHERE d.leased),
           array_agg(d.at) FILTER (WHERE d.leased),
           array_agg(d.account) FILTER (WHERE d.had_slot AND NOT d.leased)
    INTO v_kept_ids, v_kept_accounts, v_kept_at, v_released
    FROM (SELECT * FROM decided ORDER BY ord) d;

    -- The rows are locked already, by the reservation, so the slots go back at once; one
    -- element per account, as apply_account_feedback takes them.
    IF v_released IS NOT NULL THEN
        PERFORM herald.apply_account_feedback(
            p_namespace, array_agg(r.account ORDER BY r.account COLLATE "C"),
            array_agg(r.n ORDER BY r.account COLLATE "C"),
            array_agg(r.n ORDER BY r.account COLLATE "C"),
            array_fill(0, ARRAY[count(*)::integer]), array_fill(0, ARRAY[count(*)::integer]),
            array_fill(0::bigint, ARRAY[count(*)::integer]),
            array_fill(0, ARRAY[count(*)::integer]), array_fill(0, ARRAY[count(*)::integer]),
            array_fill(NULL::text, ARRAY[count(*)::integer]))
        FROM (SELECT u.account, count(*)::integer AS n
              FROM unnest(v_released) AS u(account)
              GROUP BY u.account) r;
    END IF;

    RETURN QUERY
    SELECT k.id, k.account, k.at
    FROM unnest(v_kept_ids, v_kept_accounts, v_kept_at) AS k(id, account, at);
END
$$;

-- Applies what reports, expiries and releases say about accounts to their rows at once, one
-- row per account (herald.account_feedback decides what waits instead): frees in-flight slots,
-- refunds the daily count of leases that sent nothing, halves the
-- effective rate on RATE_LIMITED (down to the floor) and pauses the account for retry_after,
-- raises it back a quarter of the configured rate per run of `recovery_successes` successes
-- (as many steps as the batch's successes make), takes the account offline for its cool-down
-- on ACCOUNT_UNAVAILABLE, folds every outcome into the account's recent success rate, and
-- pauses an account whose recent failure rate reached its pause_failure_rate (after at least
-- 20 outcomes), raising `account.paused`. Returns true when an account that had no in-flight
-- room gained some, so dispatchers should look again.
--
-- One statement for the whole batch: a report batch touches every account it sent for (all 100
-- in the routed benchmark), and a row-at-a-time loop cost about half a millisecond per account
-- per batch, the largest fixed cost of the routed report path (docs/performance.md, S5). Rows
-- are locked in id order byte by byte, whatever order p_ids is in, as herald.lock_accounts
-- takes them for the claims' reservations, so the two never deadlock.
CREATE OR REPLACE FUNCTION herald.apply_account_feedback(
    p_namespace text, p_ids text[], p_released integer[], p_refund integer[], p_ok integer[],
    p_rate_limited integer[], p_retry_after_ms bigint[], p_unavailable integer[],
    p_failed integer[], p_reason text[], p_now timestamptz DEFAULT NULL
) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_freed boolean;
BEGIN
    WITH f AS (
        SELECT *
        FROM unnest(p_ids, p_released, p_refund, p_ok, p_rate_limited, p_retry_after_ms,
                    p_unavailable, p_failed, p_reason)
            AS f(id, released, refund, ok, rate_limited, retry_after_ms, unavailable, failed,
                 reason)
    ),
    -- Rows locked in id order byte by byte, whatever order p_ids is in, as
    -- herald.lock_accounts takes them (the nested loop is driven by the sorted input).
    locked AS (
        SELECT a.*, f.released, f.refund, f.ok, f.rate_limited, f.retry_after_ms,
               f.unavailable, coalesce(f.failed, 0) AS failed, f.reason
        FROM (SELECT * FROM f ORDER BY f.id COLLATE "C") f
        CROSS JOIN LATERAL (
            SELECT * FROM herald.accounts a
            WHERE a.namespace = p_namespace AND a.id = f.id
            FOR UPDATE
        ) a
    ),
    -- As in reserve_capacity: the clock after the lock, never behind the bucket's. The bucket
    -- is settled at the old rate before the rate changes.
    settled AS (
        SELECT l.*, v.now,
               least(l.burst::double precision,
                     l.tokens + greatest(extract(epoch FROM v.now - l.tokens_at), 0)
                                * l.effective_rate) AS settled_tokens,
               l.ok + l.rate_limited + l.unavailable + l.failed AS outcomes
        FROM locked l
        CROSS JOIN LATERAL (
            SELECT greatest(coalesce(p_now, herald.clock()), l.tokens_at) AS now
        ) v
    ),
    rated AS (
        SELECT s.*,
               CASE WHEN s.rate_limited > 0
                    THEN greatest(s.rate_per_sec * s.adaptive_floor, s.effective_rate / 2)
                    WHEN s.ok > 0 THEN up.rate
                    ELSE s.effective_rate END AS new_rate,
               CASE WHEN s.rate_limited > 0 THEN 0
                    WHEN s.ok > 0 THEN up.streak
                    ELSE s.success_streak END AS new_streak,
               CASE WHEN s.rate_limited > 0 THEN least(s.settled_tokens, 0)
                    ELSE s.settled_tokens END AS new_tokens,
               CASE WHEN s.rate_limited > 0
                    THEN format('halved to %s/s after the provider answered RATE_LIMITED',
                                round(greatest(s.rate_per_sec * s.adaptive_floor,
                                               s.effective_rate / 2)::numeric, 3))
                    WHEN s.ok > 0 AND up.steps > 0
                    THEN format('raised to %s/s after %s successes', round(up.rate::numeric, 3),
                                up.steps * s.recovery_successes)
                    ELSE s.rate_reason END AS new_reason,
               CASE WHEN s.rate_limited > 0 OR (s.ok > 0 AND up.steps > 0) THEN s.now
                    ELSE s.rate_changed_at END AS new_changed_at,
               -- The recent success rate: each outcome weighs 5 %, so about the last 20 count.
               CASE WHEN s.outcomes > 0
                    THEN s.success_ewma * power(0.95, s.outcomes)
                         + (s.ok::double precision / s.outcomes) * (1 - power(0.95, s.outcomes))
                    ELSE s.success_ewma END AS new_ewma
        FROM settled s
        -- Summed in bigint and capped: an integer sum of a streak that grew for weeks failed
        -- every feedback of the account (raised_rate no longer lets it grow, but rows written
        -- before may hold one).
        CROSS JOIN LATERAL herald.raised_rate(
            s.effective_rate, least(s.success_streak::bigint + s.ok, 2147483647)::integer,
            s.rate_per_sec, s.recovery_successes) up
    ),
    judged AS (
        SELECT r.*,
               r.pause_failure_rate IS NOT NULL AND r.state <> 'paused' AND r.outcomes > 0
                   AND r.outcomes_seen + r.outcomes >= 20
                   AND 1 - r.new_ewma >= r.pause_failure_rate AS pause,
               r.unavailable > 0 AND r.state <> 'paused' AS goes_offline
        FROM rated r
    ),
    updated AS (
        UPDATE herald.accounts a SET
            in_flight = greatest(0, j.in_flight - j.released),
            day_count = CASE WHEN j.day = (j.now AT TIME ZONE j.time_zone)::date
                             THEN greatest(0, j.day_count - j.refund) ELSE j.day_count END,
            tokens = j.new_tokens,
            tokens_at = j.now,
            effective_rate = j.new_rate,
            success_streak = j.new_streak,
            rate_reason = j.new_reason,
            rate_changed_at = j.new_changed_at,
            throttled_until = CASE
                WHEN j.rate_limited > 0 AND j.retry_after_ms > 0
                THEN greatest(coalesce(j.throttled_until, j.now),
                              j.now + j.retry_after_ms * interval '1 millisecond')
                ELSE j.throttled_until END,
            state = CASE WHEN j.pause THEN 'paused'::herald.account_state
                         WHEN j.goes_offline THEN 'offline'::herald.account_state
                         ELSE j.state END,
            offline_until = CASE WHEN NOT j.pause AND j.goes_offline
                                 THEN j.now + j.offline_cooldown_ms * interval '1 millisecond'
                                 ELSE j.offline_until END,
            state_reason = CASE
                WHEN j.pause THEN format(
                    'paused itself: %s%% of recent sends failed (pause_failure_rate %s%%)',
                    round(((1 - j.new_ewma) * 100)::numeric, 1),
                    round((j.pause_failure_rate * 100)::numeric, 1))
                WHEN j.goes_offline THEN coalesce(j.reason, 'ACCOUNT_UNAVAILABLE')
                ELSE j.state_reason END,
            success_ewma = j.new_ewma,
            -- Only "at least 20" is ever asked; counted on for the account's whole life, it
            -- overflowed an integer and failed every feedback of the account from then on.
            outcomes_seen = least(j.outcomes_seen::bigint + j.outcomes, 20)::integer
        FROM judged j
        WHERE a.namespace = p_namespace AND a.id = j.id
        RETURNING a.namespace, a.id, a.pool, a.state_reason, j.pause, j.new_ewma,
                  j.max_in_flight IS NOT NULL AND j.in_flight >= j.max_in_flight
                      AND j.released > 0 AS freed
    ),
    announced AS (
        SELECT count(herald.notify_event('account.paused', jsonb_build_object(
                   'namespace', u.namespace, 'account_id', u.id, 'pool', u.pool,
                   'reason', u.state_reason, 'failure_rate', 1 - u.new_ewma))) AS n
        FROM updated u
        WHERE u.pause
    )
    SELECT coalesce(bool_or(u.freed), false) INTO v_freed
    FROM updated u, announced;
    RETURN v_freed;
END
$$;

-- Takes what reports, expiries and releases say about accounts, one array element per account
-- (see herald.apply_account_feedback for what each part does), without making report batches
-- and claims wait for each other on the account rows (docs/performance.md, S5). An account whose
-- news is only freed slots and successes, and whose rate is not recovering from a rate limit,
-- gets a row in herald.account_deltas, and its row is not locked: herald.account_in_flight
-- counts the freed slots at once, and the successes (the success rate, the streak) count when
-- herald.fold_account_deltas folds them in, soon after. Anything else (a refund, RATE_LIMITED,
-- ACCOUNT_UNAVAILABLE, a failure, successes that raise a lowered rate) is applied at once,
-- with what was waiting for that account folded in first, so pausing, backing off, recovering
-- and going offline act on the next claim as before. A caller that passes p_now (tests driving
-- the clock) has everything applied at once. Returns true when an account that had no
-- in-flight room gained some, so dispatchers should look again.
CREATE OR REPLACE FUNCTION herald.account_feedback(
    p_namespace text, p_ids text[], p_released integer[], p_refund integer[], p_ok integer[],
    p_rate_limited integer[], p_retry_after_ms bigint[], p_unavailable integer[],
    p_failed integer[], p_reason text[], p_now timestamptz DEFAULT NULL
) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_deferred boolean[];
    v_freed boolean := false;
    v_now_ids text[];
BEGIN
    -- Read without a lock: an account whose rate dropped concurrently has this batch's
    -- successes count towards its recovery at the next fold instead of now.
    SELECT array_agg(p_now IS NULL AND coalesce(f.refund, 0) = 0
                     AND coalesce(f.rate_limited, 0) = 0 AND coalesce(f.unavailable, 0) = 0
                     AND coalesce(f.failed, 0) = 0
                     AND coalesce(a.effective_rate >= a.rate_per_sec, true)
                     ORDER BY f.ord)
    INTO v_deferred
    FROM unnest(p_ids, p_refund, p_rate_limited, p_unavailable, p_failed)
        WITH ORDINALITY AS f(id, refund, rate_limited, unavailable, failed, ord)
    LEFT JOIN herald.accounts a ON a.namespace = p_namespace AND a.id = f.id;

    INSERT INTO herald.account_deltas (namespace, account_id, released, ok)
    SELECT p_namespace, f.id, coalesce(f.released, 0), coalesce(f.ok, 0)
    FROM unnest(p_ids, p_released, p_ok, v_deferred) AS f(id, released, ok, deferred)
    WHERE f.deferred AND (coalesce(f.released, 0) > 0 OR coalesce(f.ok, 0) > 0);

    -- Room came back on an account that was at its in-flight limit before these releases (the
    -- deltas just written are counted by account_in_flight already).
    -- Each account probed by its key (the fence keeps the probe): as a plain join the planner,
    -- sure of two accounts, compared every batch account with every account of the namespace
    -- (docs/performance.md, S5).
    SELECT coalesce(bool_or(herald.account_in_flight(l.a) + f.released >= (l.a).max_in_flight),
                    false)
    INTO v_freed
    FROM unnest(p_ids, p_released, v_deferred) AS f(id, released, deferred)
    CROSS JOIN LATERAL (
        SELECT a FROM herald.accounts a
        WHERE a.namespace = p_namespace AND a.id = f.id AND a.max_in_flight IS NOT NULL
        OFFSET 0
    ) l
    WHERE f.deferred AND f.released > 0;

    SELECT array_agg(f.id ORDER BY f.ord) INTO v_now_ids
    FROM unnest(p_ids, v_deferred) WITH ORDINALITY AS f(id, deferred, ord)
    WHERE NOT f.deferred;
    IF v_now_ids IS NULL THEN
        RETURN v_freed;
    END IF;
    -- What was waiting happened first: folded before this batch's news, so successes from
    -- before a rate limit do not count towards its recovery. The fold locks the rows (in id
    -- order byte by byte, as apply_account_feedback would).
    PERFORM herald.fold_account_deltas(p_namespace, v_now_ids);
    SELECT herald.apply_account_feedback(
        p_namespace, v_now_ids,
        array_agg(f.released ORDER BY f.ord), array_agg(f.refund ORDER BY f.ord),
        array_agg(f.ok ORDER BY f.ord), array_agg(f.rate_limited ORDER BY f.ord),
        array_agg(f.retry_after_ms ORDER BY f.ord), array_agg(f.unavailable ORDER BY f.ord),
        array_agg(f.failed ORDER BY f.ord), array_agg(f.reason ORDER BY f.ord), p_now)
        OR v_freed
    INTO v_freed
    FROM unnest(p_ids, p_released, p_refund, p_ok, p_rate_limited, p_retry_after_ms,
                p_unavailable, p_failed, p_reason, v_deferred)
        WITH ORDINALITY AS f(id, released, refund, ok, rate_limited, retry_after_ms,
                             unavailable, failed, reason, deferred, ord)
    WHERE NOT f.deferred;
    RETURN v_freed;
END
$$;

-- Folds what is waiting in herald.account_deltas for accounts p_ids of p_namespace into their
-- rows (herald.apply_account_feedback) and deletes it. Room it frees was counted already, by
-- herald.account_in_flight, when the delta was written. The rows are locked (byte by byte, by
-- herald.lock_accounts) before the deltas are read: two folds of one account then take turns,
-- and each delta is deleted, and applied, by exactly one of them. A delta committed while this
-- runs waits for the next fold.
CREATE OR REPLACE FUNCTION herald.fold_account_deltas(p_namespace text, p_ids text[])
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_ids text[];
    v_released integer[];
    v_ok integer[];
    v_zeros integer[];
BEGIN
    PERFORM herald.lock_accounts(p_namespace, p_ids);

    WITH gone AS (
        DELETE FROM herald.account_deltas d
        WHERE d.namespace = p_namespace AND d.account_id = ANY(p_ids)
        RETURNING d.account_id, d.released, d.ok
    ),
    summed AS (
        SELECT g.account_id, sum(g.released)::integer AS released, sum(g.ok)::integer AS ok
        FROM gone g
        GROUP BY g.account_id
    )
    SELECT array_agg(s.account_id ORDER BY u.ord), array_agg(s.released ORDER BY u.ord),
           array_agg(s.ok ORDER BY u.ord)
    INTO v_ids, v_released, v_ok
    FROM summed s
    JOIN unnest(p_ids) WITH ORDINALITY AS u(id, ord) ON u.id = s.account_id;

    IF v_ids IS NULL THEN
        RETURN;
    END IF;
    v_zeros := array_fill(0, ARRAY[cardinality(v_ids)]);
    PERFORM herald.apply_account_feedback(
        p_namespace, v_ids, v_released, v_zeros, v_ok, v_zeros,
        array_fill(0::bigint, ARRAY[cardinality(v_ids)]), v_zeros, v_zeros,
        array_fill(NULL::text, ARRAY[cardinality(v_ids)]));
END
$$;

-- How far `recovery_successes` runs of successes raise an effective rate towards the configured
-- one, a quarter of it per run: the rate, the successes left over, and the runs used.
CREATE OR REPLACE FUNCTION herald.raised_rate(
    p_rate double precision, p_streak integer, p_configured double precision,
    p_per_step integer, OUT rate double precision, OUT streak integer, OUT steps integer
) LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    rate := p_rate;
    streak := p_streak;
    steps := 0;
    WHILE rate < p_configured AND streak >= p_per_step LOOP
        rate := least(p_configured, rate + p_configured * 0.25);
        streak := streak - p_per_step;
        steps := steps + 1;
    END LOOP;
    -- At the configured rate there is nothing to recover: a streak kept growing there (by every
    -- success, for weeks at a high rate) until it overflowed its integer.
    IF rate >= p_configured THEN
        streak := 0;
    END IF;
END
$$;
