-- Sending like a careful operator (docs/accounts.md): warm-up ramps, human-like gaps, messaging
-- tiers, health and self-pause on accounts; sticky pools; recipient-local send windows on
-- tasks. What each limit does lives in store/accounts/functions.sql (herald.account_room) and
-- store/tasks/functions.sql (the send window).

ALTER TABLE herald.accounts
    -- Warm-up: the daily cap of day n (1 on ramp_start, in the account's zone) is
    -- ramp_table[n] (its last value after the table ends) or
    -- least(ramp_ceiling, ramp_initial + (n - 1) * ramp_step). Before ramp_start it is 0.
    ADD COLUMN ramp_start date,
    ADD COLUMN ramp_initial integer,
    ADD COLUMN ramp_step integer,
    ADD COLUMN ramp_ceiling integer,
    ADD COLUMN ramp_table integer[],
    -- Human-like gaps: at least gap_min_ms, plus a uniform random part up to gap_max_ms,
    -- between two grants; next_send_at is the earliest next grant.
    ADD COLUMN gap_min_ms bigint,
    ADD COLUMN gap_max_ms bigint,
    ADD COLUMN next_send_at timestamptz,
    -- Messaging tier: unique recipients of business-initiated conversations per rolling
    -- 24 hours (NULL: unlimited). tier_used is the count as of tier_counted_at plus the
    -- conversations opened since (a recount drops the ones older than 24 hours).
    ADD COLUMN tier_limit integer,
    ADD COLUMN tier_used integer NOT NULL DEFAULT 0,
    ADD COLUMN tier_counted_at timestamptz,
    -- Health: an exponentially weighted success rate of recent outcomes, how many outcomes
    -- it has seen, the provider's quality rating, and the failure rate at which the account
    -- pauses itself (NULL: never).
    ADD COLUMN success_ewma double precision NOT NULL DEFAULT 1,
    ADD COLUMN outcomes_seen integer NOT NULL DEFAULT 0,
    ADD COLUMN quality text NOT NULL DEFAULT 'unknown',
    ADD COLUMN pause_failure_rate double precision;

ALTER TABLE herald.recipient_sends
    -- When the business-initiated conversation counted against the tier opened (24 hours).
    ADD COLUMN opened_at timestamptz,
    -- When the recipient last wrote to the account: a customer-service window is open for
    -- 24 hours after it, and messages inside it do not count against the tier.
    ADD COLUMN inbound_at timestamptz;
CREATE INDEX recipient_sends_opened ON herald.recipient_sends (namespace, account_id, opened_at)
    WHERE opened_at IS NOT NULL;

-- Sticky pools keep each recipient on the account that last messaged them while it is healthy.
ALTER TABLE herald.pools ADD COLUMN sticky boolean NOT NULL DEFAULT false;

-- A recipient-local send window: the task is only sent between window_start and window_end
-- (which may cross midnight) in window_zone; due outside it, it waits for the next opening
-- plus a spread of up to window_spread_ms, so a window does not open with a burst.
ALTER TABLE herald.tasks
    ADD COLUMN window_start time,
    ADD COLUMN window_end time,
    ADD COLUMN window_zone text,
    ADD COLUMN window_spread_ms bigint;
