-- Locks an account row. Claims, sweeps and releases change in_flight only while they hold this
-- lock, and reports either do too or record their released slots in account_deltas, in the
-- transaction that moves their tasks; so once it is ours every lease counted by the next
-- statement is reflected in in_flight less the deltas that statement sees, and every one still
-- to end or begin will adjust either after we commit.
SELECT in_flight FROM herald.accounts WHERE namespace = $1 AND id = $2 FOR UPDATE
