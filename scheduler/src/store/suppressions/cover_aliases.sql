-- Lists the other names of the listed recipients among $2 (namespace $1) with the same reason
-- (herald.cover_aliases). Returns the names newly listed.
SELECT r AS recipient
FROM herald.cover_aliases($1, ARRAY(SELECT herald.recipient_key(k) FROM unnest($2::text[]) AS k)) AS r
