-- Deletes up to $2 stored replies recorded more than $1 ms ago (the task retention): they are
-- kept for a look at what recipients said, not for ever. Opt-outs stay on the suppression list.
DELETE FROM herald.inbound_messages
WHERE id = ANY(ARRAY(
    SELECT id FROM herald.inbound_messages
    WHERE recorded_at < herald.now() - $1::bigint * interval '1 millisecond'
    ORDER BY recorded_at
    LIMIT $2))
