-- The accounts of namespace $1 whose credentials the executors hold under the name $2.
SELECT id FROM herald.accounts WHERE namespace = $1 AND credentials_ref = $2 ORDER BY id
