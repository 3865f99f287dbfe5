-- Replaces an account's definition (the caller merged the update mask); $8 holds the limits as
-- in insert_account.sql. A changed rate resets the effective rate; a state set by an operator
-- ends an offline spell; a smaller burst empties the bucket down to it. A new time zone takes
-- today's count with it: the count kept for the old zone's current day becomes the new zone's
-- current day's (left on the old date, it read as a fresh day and the account was given a
-- second full daily cap at once). An operator resuming a paused account gives it a fresh record
-- of outcomes: kept, the failures that paused it still weighed most in its recent success rate,
-- so its first outcome after the resume, a success included, paused it again. New gaps move
-- the next paced send to at most the new longest gap from now: kept, a send planned a long old
-- gap ahead held the account for all of it.
UPDATE herald.accounts a SET
    sender_kind = $3, pool = $4, time_zone = $5, credentials_ref = $6,
    day = CASE WHEN a.time_zone IS DISTINCT FROM $5
                    AND a.day = (herald.now() AT TIME ZONE a.time_zone)::date
               THEN (herald.now() AT TIME ZONE $5)::date ELSE a.day END,
    state = $7::text::herald.account_state,
    success_ewma = CASE WHEN a.state = 'paused' AND $7::text = 'active' THEN 1
                        ELSE a.success_ewma END,
    outcomes_seen = CASE WHEN a.state = 'paused' AND $7::text = 'active' THEN 0
                         ELSE a.outcomes_seen END,
    offline_until = CASE WHEN $7::text = 'offline' THEN a.offline_until ELSE NULL END,
    state_reason = CASE WHEN a.state::text = $7::text THEN a.state_reason
                        ELSE 'set by an operator' END,
    effective_rate = CASE WHEN a.rate_per_sec = l.rate_per_sec
                          THEN least(a.effective_rate, l.rate_per_sec) ELSE l.rate_per_sec END,
    rate_reason = CASE WHEN a.rate_per_sec = l.rate_per_sec THEN a.rate_reason
                       ELSE 'configured rate' END,
    rate_changed_at = CASE WHEN a.rate_per_sec = l.rate_per_sec THEN a.rate_changed_at
                           ELSE herald.now() END,
    tokens = least(a.tokens, l.burst::float8),
    next_send_at = CASE WHEN (a.gap_min_ms, a.gap_max_ms) IS DISTINCT FROM (l.gap_min_ms, l.gap_max_ms)
                        THEN least(a.next_send_at,
                                   herald.now() + coalesce(l.gap_max_ms, l.gap_min_ms, 0)
                                                  * interval '1 millisecond')
                        ELSE a.next_send_at END,
    ({limit_columns}) = ROW({limit_values}),
    updated_at = herald.now()
FROM jsonb_populate_record(NULL::herald.accounts, $8::jsonb) l
WHERE a.namespace = $1 AND a.id = $2
