-- How herald compares recipients: the one rule the suppression list, the accounts' recipient
-- pairs (spacing, provider blocks, open conversations) and every statement that checks a task
-- against them share, as rules::recipient_key does in Rust. Applied by the migrator whenever
-- this file changes, before the other function files (they may call it).

-- The form two spellings of one recipient share: a phone number with and without its leading
-- '+' (WhatsApp takes both and answers with the digits alone) is one person (migration 35).
-- A plain SQL expression, IMMUTABLE: the planner inlines it where it is called, so a statement
-- using it is planned (and costs) as if the expression were written there, and it can stand in
-- an index expression.
CREATE OR REPLACE FUNCTION herald.recipient_key(p_recipient text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ltrim(p_recipient, '+')
$$;
