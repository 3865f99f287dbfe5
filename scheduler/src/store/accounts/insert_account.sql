-- Creates an account. $8 holds the limits as a JSON object keyed by column name; the column
-- lists are filled in from accounts/model.rs's AccountLimits at start-up, so a new limit needs
-- no change here. The bucket starts full and the effective rate at the configured one.
INSERT INTO herald.accounts (namespace, id, sender_kind, pool, time_zone, credentials_ref, state,
                             effective_rate, tokens, tokens_at, rate_changed_at, created_at,
                             updated_at, {limit_columns})
SELECT $1, $2, $3, $4, $5, $6, $7::text::herald.account_state,
       l.rate_per_sec, l.burst, herald.now(), herald.now(), herald.now(), herald.now(),
       {limit_values}
FROM jsonb_populate_record(NULL::herald.accounts, $8::jsonb) l
