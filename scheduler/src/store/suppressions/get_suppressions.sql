-- The entries of namespace $1 for recipients $2 (any of them may be unlisted).
SELECT recipient, reason::text AS reason, note, created_at
FROM herald.suppressions
WHERE namespace = $1 AND recipient = ANY(ARRAY(SELECT herald.recipient_key(r) FROM unnest($2::text[]) r))
