-- Tasks, their attempts and idempotency keys.
CREATE SCHEMA IF NOT EXISTS herald;

CREATE TYPE herald.task_state AS ENUM
    ('scheduled', 'leased', 'succeeded', 'failed', 'cancelled', 'expired');

CREATE TABLE herald.tasks (
    id                 uuid PRIMARY KEY,
    namespace          text NOT NULL DEFAULT 'default',
    queue              text NOT NULL,
    recipient          text NOT NULL,
    -- herald.v1.Content, prost-encoded: what is sent, exactly as created.
    content            bytea NOT NULL,
    -- Copied out of content so stats can group by template without decoding.
    template_id        text,
    labels             jsonb NOT NULL DEFAULT '{}'::jsonb,
    state              herald.task_state NOT NULL DEFAULT 'scheduled',
    priority           smallint NOT NULL,
    run_at             timestamptz NOT NULL,
    expire_at          timestamptz,
    idempotency_key    text,
    -- Leases granted so far; (id, lease_count) is the fencing token of the current lease.
    lease_count        integer NOT NULL DEFAULT 0,
    -- Attempts charged against max_attempts (ACCOUNT_UNAVAILABLE is not charged).
    attempts           integer NOT NULL DEFAULT 0,
    max_attempts       integer NOT NULL,
    -- Retry policy: explicit delays win when non-empty, else capped exponential with jitter.
    retry_delays_ms    bigint[] NOT NULL DEFAULT '{}',
    backoff_initial_ms bigint NOT NULL,
    backoff_max_ms     bigint NOT NULL,
    backoff_multiplier double precision NOT NULL,
    backoff_jitter     double precision NOT NULL,
    executor_id        text,
    leased_at          timestamptz,
    lease_expires_at   timestamptz,
    cancel_outcome     smallint,
    last_error         text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    finished_at        timestamptz
);

-- The claim walks this index once per priority level (see claim_due.sql), so future tasks are
-- never visited and the claim stays flat as the table grows.
CREATE INDEX tasks_due ON herald.tasks (priority, run_at) WHERE state = 'scheduled';
-- The sweeper finds leases past their expiry.
CREATE INDEX tasks_lease_expiry ON herald.tasks (lease_expires_at) WHERE state = 'leased';
-- The sweeper finds scheduled tasks past their deadline.
CREATE INDEX tasks_deadline ON herald.tasks (expire_at)
    WHERE state = 'scheduled' AND expire_at IS NOT NULL;

CREATE TABLE herald.attempts (
    task_id             uuid NOT NULL,
    attempt             integer NOT NULL,
    executor_id         text NOT NULL,
    account             text,
    outcome             smallint NOT NULL,
    error               text,
    provider_message_id text,
    retry_after_ms      bigint,
    leased_at           timestamptz NOT NULL,
    started_at          timestamptz,
    finished_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, attempt)
);

-- Outlives its task by the configured retention, so a late retry of a create request after the
-- task ended and was pruned still finds the original instead of sending twice.
CREATE TABLE herald.idempotency_keys (
    namespace    text NOT NULL,
    key          text NOT NULL,
    task_id      uuid NOT NULL,
    request_hash bytea NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    -- Set once the task has ended: the key may be forgotten after this time.
    forget_after timestamptz,
    PRIMARY KEY (namespace, key)
);
CREATE INDEX idempotency_keys_task ON herald.idempotency_keys (task_id);
CREATE INDEX idempotency_keys_forget ON herald.idempotency_keys (forget_after)
    WHERE forget_after IS NOT NULL;

-- The delay before the next attempt, in milliseconds: the n-th entry of an explicit list (its
-- last entry repeating), else min(initial * multiplier^(n-1), max) with up to `jitter` of it
-- randomised away so that retries of a batch that failed together spread out.
CREATE FUNCTION herald.retry_delay_ms(
    n integer, delays bigint[], initial_ms bigint, max_ms bigint,
    multiplier double precision, jitter double precision
) RETURNS bigint LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN cardinality(delays) > 0 THEN delays[least(greatest(n, 1), cardinality(delays))]
        ELSE (least(initial_ms * power(multiplier, greatest(n, 1) - 1), max_ms)
              * (1 - jitter * random()))::bigint
    END
$$;

-- Retention finds finished tasks by age.
CREATE INDEX tasks_finished ON herald.tasks (finished_at) WHERE finished_at IS NOT NULL;
