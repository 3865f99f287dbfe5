-- Folds what waits in account_deltas for accounts $2 of namespace $1 into their rows (see
-- herald.fold_account_deltas in functions.sql).
SELECT herald.fold_account_deltas($1, $2)
