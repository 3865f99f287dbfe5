-- One bulk operation.
SELECT {operation_columns} FROM herald.bulk_operations WHERE namespace = $1 AND id = $2
