-- A page of a namespace's bulk operations, newest first (ids are UUIDv7), before id $2.
SELECT {operation_columns} FROM herald.bulk_operations
WHERE namespace = $1 AND ($2::uuid IS NULL OR id < $2)
ORDER BY id DESC
LIMIT $3
