-- The LEASED tasks of namespace $1 to the recipients $2 (compared as the suppression list
-- does, without a leading '+'): what a new suppression must still stop, since the claim checks
-- the list only before it leases. Leased tasks are what executors hold, a few thousand at
-- most, so reading them all costs little.
SELECT t.id
FROM herald.tasks t
WHERE t.namespace = $1 AND t.state = 'leased'
  AND herald.recipient_key(t.recipient) = ANY(ARRAY(SELECT herald.recipient_key(r) FROM unnest($2::text[]) AS r))
