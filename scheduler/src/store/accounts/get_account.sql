-- One account with its live status.
SELECT {account_columns}
FROM herald.accounts a
WHERE a.namespace = $1 AND a.id = $2
