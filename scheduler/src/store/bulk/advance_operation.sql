-- Records a committed batch: the cursor, the counts, and DONE once a batch found nothing.
UPDATE herald.bulk_operations
SET cursor_id = coalesce($3, cursor_id),
    processed = processed + $4,
    changed = changed + $5,
    state = CASE WHEN $6 THEN 'done' ELSE state END,
    finished_at = CASE WHEN $6 THEN now() ELSE finished_at END,
    updated_at = now()
WHERE namespace = $1 AND id = $2
