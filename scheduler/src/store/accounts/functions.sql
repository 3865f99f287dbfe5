-- The account limit functions: the one definition of every per-account limit, and how claims
-- reserve capacity and reports feed back. Applied by the migrator after the numbered
-- migrations whenever this file changes (CREATE OR REPLACE, in the migration transaction), so
-- a limit is changed here, in place, instead of restating these bodies in a new migration.
-- A change to a function's signature must DROP the old one first.

-- How much an account may send at p_now: the single definition of every limit, used both to
-- plan a claim and to reserve capacity. `room` is what any task may take, `room_low` what a task
-- below high_priority_min may take (the rest of the in-flight slots are kept for high
-- priority). When room is 0, `available_at` says when time alone will open it again (NULL when
-- only an event will: the account is paused, or every in-flight slot is taken).
CREATE OR REPLACE FUNCTION herald.account_room(
    a herald.accounts, p_now timestamptz,
    OUT room integer, OUT room_low integer, OUT tokens double precision,
    OUT day_used integer, OUT reopen boolean, OUT available_at timestamptz
) LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_local timestamp := p_now AT TIME ZONE a.time_zone;
    v_quiet boolean := false;
    big constant integer := 2147483647;
BEGIN
    tokens := least(a.burst::double precision,
                    a.tokens + greatest(extract(epoch FROM p_now - a.tokens_at), 0)
                               * a.effective_rate);
    day_used := CASE WHEN a.day = v_local::date THEN a.day_count ELSE 0 END;
    reopen := a.state = 'offline' AND a.offline_until <= p_now;
    IF a.quiet_start IS NOT NULL THEN
        v_quiet := CASE WHEN a.quiet_start <= a.quiet_end
                        THEN v_local::time >= a.quiet_start AND v_local::time < a.quiet_end
                        ELSE v_local::time >= a.quiet_start OR v_local::time < a.quiet_end END;
    END IF;
    room := least(floor(tokens)::integer,
                  coalesce(a.daily_cap - day_used, big),
                  coalesce(a.max_in_flight - a.in_flight, big));
    room_low := least(room,
        coalesce(floor(a.max_in_flight * (1 - a.high_priority_reserve))::integer - a.in_flight,
                 big));
    available_at := p_now;
    IF a.state = 'paused' THEN
        available_at := NULL;
    END IF;
    IF a.state = 'offline' AND NOT reopen THEN
        available_at := greatest(available_at, a.offline_until);
    END IF;
    IF a.throttled_until > p_now THEN
        available_at := greatest(available_at, a.throttled_until);
    END IF;
    IF v_quiet THEN
        available_at := greatest(available_at,
            ((v_local::date + a.quiet_end
              + CASE WHEN v_local::time >= a.quiet_end THEN interval '1 day'
                     ELSE interval '0' END) AT TIME ZONE a.time_zone));
    END IF;
    IF tokens < 1 THEN
        available_at := greatest(available_at,
            p_now + (1 - tokens) / a.effective_rate * interval '1 second');
    END IF;
    IF a.daily_cap IS NOT NULL AND day_used >= a.daily_cap THEN
        available_at := greatest(available_at,
            ((v_local::date + 1)::timestamp AT TIME ZONE a.time_zone));
    END IF;
    IF a.max_in_flight IS NOT NULL AND a.in_flight >= a.max_in_flight THEN
        available_at := NULL;
    END IF;
    IF available_at IS DISTINCT FROM p_now THEN
        room := 0;
        room_low := 0;
    END IF;
    room := greatest(room, 0);
    room_low := greatest(room_low, 0);
END
$$;

-- Reserves capacity on accounts for a claim, atomically per account row: each account grants at
-- most its account_room at p_now and records what it granted. Concurrent claims on other
-- sessions or replicas serialise on the account row, so together they can never grant more
-- than the limits. Time is read after the row lock is taken (herald.clock(), not the
-- transaction's start), so reservations on one account happen in clock order and the bucket's
-- clock never runs backwards; tests pass p_now to drive the clock (across midnight, say).
-- out_at is the reservation's time: the lease's grant time.
CREATE OR REPLACE FUNCTION herald.reserve_capacity(
    p_namespace text, p_ids text[], p_high integer[], p_low integer[],
    p_now timestamptz DEFAULT NULL
) RETURNS TABLE (out_account text, out_high integer, out_low integer, out_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    a herald.accounts%ROWTYPE;
    r record;
    i integer;
    v_high integer;
    v_low integer;
    v_now timestamptz;
BEGIN
    -- Callers pass ids sorted, so concurrent claims lock account rows in one order.
    FOR i IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
        SELECT * INTO a FROM herald.accounts
        WHERE namespace = p_namespace AND id = p_ids[i]
        FOR UPDATE;
        IF NOT FOUND THEN
            CONTINUE;
        END IF;
        v_now := greatest(coalesce(p_now, herald.clock()), a.tokens_at);
        r := herald.account_room(a, v_now);
        v_low := greatest(0, least(p_low[i], r.room_low));
        v_high := greatest(0, least(p_high[i], r.room - v_low));
        UPDATE herald.accounts SET
            tokens = r.tokens - (v_high + v_low),
            tokens_at = v_now,
            in_flight = a.in_flight + v_high + v_low,
            day = (v_now AT TIME ZONE a.time_zone)::date,
            day_count = r.day_used + v_high + v_low,
            state = CASE WHEN r.reopen THEN 'active'::herald.account_state ELSE a.state END,
            state_reason = CASE WHEN r.reopen THEN 'offline cool-down over'
                                ELSE a.state_reason END
        WHERE namespace = p_namespace AND id = a.id;
        out_account := a.id;
        out_high := v_high;
        out_low := v_low;
        out_at := v_now;
        RETURN NEXT;
    END LOOP;
END
$$;

-- Applies what reports, expiries and releases say about accounts, one row per account:
-- frees in-flight slots, refunds the daily count of leases that sent nothing, halves the
-- effective rate on RATE_LIMITED (down to the floor) and pauses the account for retry_after,
-- raises it back a quarter of the configured rate per run of `recovery_successes` successes,
-- and takes the account offline for its cool-down on ACCOUNT_UNAVAILABLE. Returns true when an
-- account that had no in-flight room gained some, so dispatchers should look again.
CREATE OR REPLACE FUNCTION herald.account_feedback(
    p_namespace text, p_ids text[], p_released integer[], p_refund integer[], p_ok integer[],
    p_rate_limited integer[], p_retry_after_ms bigint[], p_unavailable integer[],
    p_reason text[], p_now timestamptz DEFAULT NULL
) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    a herald.accounts%ROWTYPE;
    i integer;
    v_tokens double precision;
    v_rate double precision;
    v_streak integer;
    v_reason text;
    v_changed_at timestamptz;
    v_freed boolean := false;
    v_now timestamptz;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
        SELECT * INTO a FROM herald.accounts
        WHERE namespace = p_namespace AND id = p_ids[i]
        FOR UPDATE;
        IF NOT FOUND THEN
            CONTINUE;
        END IF;
        -- As in reserve_capacity: the clock after the lock, never behind the bucket's.
        v_now := greatest(coalesce(p_now, herald.clock()), a.tokens_at);
        IF a.max_in_flight IS NOT NULL AND a.in_flight >= a.max_in_flight
           AND p_released[i] > 0 THEN
            v_freed := true;
        END IF;
        -- Settle the bucket at the old rate before the rate changes.
        v_tokens := least(a.burst::double precision,
                          a.tokens + greatest(extract(epoch FROM v_now - a.tokens_at), 0)
                                     * a.effective_rate);
        v_rate := a.effective_rate;
        v_streak := a.success_streak;
        v_reason := a.rate_reason;
        v_changed_at := a.rate_changed_at;
        IF p_rate_limited[i] > 0 THEN
            v_rate := greatest(a.rate_per_sec * a.adaptive_floor, a.effective_rate / 2);
            v_streak := 0;
            v_tokens := least(v_tokens, 0);
            v_reason := format('halved to %s/s after the provider answered RATE_LIMITED',
                               round(v_rate::numeric, 3));
            v_changed_at := v_now;
        ELSIF p_ok[i] > 0 THEN
            v_streak := a.success_streak + p_ok[i];
            IF v_rate < a.rate_per_sec AND v_streak >= a.recovery_successes THEN
                v_rate := least(a.rate_per_sec, v_rate + a.rate_per_sec * 0.25);
                v_reason := format('raised to %s/s after %s successes',
                                   round(v_rate::numeric, 3), v_streak);
                v_changed_at := v_now;
                v_streak := 0;
            END IF;
        END IF;
        UPDATE herald.accounts SET
            in_flight = greatest(0, a.in_flight - p_released[i]),
            day_count = CASE WHEN a.day = (v_now AT TIME ZONE a.time_zone)::date
                             THEN greatest(0, a.day_count - p_refund[i]) ELSE a.day_count END,
            tokens = v_tokens,
            tokens_at = v_now,
            effective_rate = v_rate,
            success_streak = v_streak,
            rate_reason = v_reason,
            rate_changed_at = v_changed_at,
            throttled_until = CASE
                WHEN p_rate_limited[i] > 0 AND p_retry_after_ms[i] > 0
                THEN greatest(coalesce(a.throttled_until, v_now),
                              v_now + p_retry_after_ms[i] * interval '1 millisecond')
                ELSE a.throttled_until END,
            state = CASE WHEN p_unavailable[i] > 0 AND a.state <> 'paused'
                         THEN 'offline'::herald.account_state ELSE a.state END,
            offline_until = CASE WHEN p_unavailable[i] > 0 AND a.state <> 'paused'
                                 THEN v_now + a.offline_cooldown_ms * interval '1 millisecond'
                                 ELSE a.offline_until END,
            state_reason = CASE WHEN p_unavailable[i] > 0 AND a.state <> 'paused'
                                THEN coalesce(p_reason[i], 'ACCOUNT_UNAVAILABLE')
                                ELSE a.state_reason END
        WHERE namespace = p_namespace AND id = a.id;
    END LOOP;
    RETURN v_freed;
END
$$;
