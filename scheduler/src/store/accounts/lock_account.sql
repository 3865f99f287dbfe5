-- Locks an account row. Claims, reports, sweeps and releases change in_flight only while they
-- hold this lock, in the transaction that moves their tasks, so once it is ours every lease
-- counted by the next statement is reflected in in_flight, and every one still to end or begin
-- will adjust it after we commit.
SELECT in_flight FROM herald.accounts WHERE namespace = $1 AND id = $2 FOR UPDATE
