-- Locks the rows of namespace $1's accounts whose credentials_ref is one of $2, in id order byte
-- by byte (COLLATE "C": the order claims and report batches take them, whatever the database's
-- collation): a webhook batch that changes accounts takes them all at once, before any recipient
-- mark, as a claim's grant takes its accounts (herald.reserve_capacity) and then the marks.
-- Returns each locked account with its credentials_ref, so the batch's events need not look them
-- up again.
SELECT credentials_ref, id FROM herald.accounts
WHERE namespace = $1 AND credentials_ref = ANY($2::text[])
ORDER BY id COLLATE "C"
FOR UPDATE
