-- Records a bulk operation; its created_at bounds the tasks it selects.
INSERT INTO herald.bulk_operations (namespace, id, action, filter, run_at, shift_ms, matched)
VALUES ($1, $2, $3, $4, $5, $6, $7)
RETURNING {operation_columns}
