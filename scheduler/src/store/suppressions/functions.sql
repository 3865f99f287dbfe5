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

-- The other names of recipients p_keys (herald.recipient_key form) of namespace p_namespace:
-- each alias a provider gave one of them, and each recipient one of them is an alias of
-- (migration 36). One step each way: a provider names a user by one id.
CREATE OR REPLACE FUNCTION herald.recipient_aliases_of(p_namespace text, p_keys text[])
RETURNS TABLE (key text, other text)
LANGUAGE sql STABLE AS $$
    SELECT a.recipient, a.alias FROM herald.recipient_aliases a
    WHERE a.namespace = p_namespace AND a.recipient = ANY(p_keys)
    UNION
    SELECT a.alias, a.recipient FROM herald.recipient_aliases a
    WHERE a.namespace = p_namespace AND a.alias = ANY(p_keys)
$$;

-- Lists the other names of the listed recipients among p_keys with the same reason, so a
-- suppression of one name stops messages to the other; a name listed already keeps its entry.
-- Returns the names newly listed.
CREATE OR REPLACE FUNCTION herald.cover_aliases(p_namespace text, p_keys text[])
RETURNS SETOF text
LANGUAGE sql VOLATILE AS $$
    INSERT INTO herald.suppressions (namespace, recipient, reason, note)
    SELECT DISTINCT ON (o.other) p_namespace, o.other, s.reason,
           left('the same person as ' || s.recipient || ': ' || s.note, 1024)
    FROM herald.recipient_aliases_of(p_namespace, p_keys) o
    JOIN herald.suppressions s ON s.namespace = p_namespace AND s.recipient = o.key
    ORDER BY o.other, s.created_at
    ON CONFLICT (namespace, recipient) DO NOTHING
    RETURNING recipient
$$;
