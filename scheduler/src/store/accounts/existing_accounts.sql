-- Which of the named accounts exist, with their sender kind (what the task's content is
-- checked against).
SELECT id, sender_kind FROM herald.accounts WHERE namespace = $1 AND id = ANY($2)
