-- Reserves capacity on the namespace's accounts $2 (sorted) for a claim: high- and
-- low-priority sends wanted per account, and how many of them open a new conversation ($5);
-- each grants at most its room now (see herald.reserve_capacity in
-- store/accounts/functions.sql); out_times are the paced instants of an account with gaps.
SELECT out_account, out_high, out_low, out_new, out_at, out_times
FROM herald.reserve_capacity($1, $2, $3, $4, $5)
