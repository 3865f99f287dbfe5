-- Edits a task that is still SCHEDULED (UpdateTask). One statement fenced on the state, so an
-- edit and a concurrent claim never both win: the claim locks the rows it leases and commits
-- them LEASED; an edit that meets such a row waits for that commit, re-evaluates this WHERE
-- on the new row version (READ COMMITTED), finds it LEASED and updates nothing. An edit that
-- commits first is simply what the claim then leases.
-- $3 / $4: the new due time, absolute or milliseconds after now (both NULL: unchanged).
-- $5: whether the content changed ($6 content, $7 its template id). The rest are written as
-- the caller merged them onto the stored task, so the statement is also fenced on the version
-- the caller merged onto ($17, its updated_at): a concurrent edit of another field committed
-- since would otherwise be written back over with the value read before it.
UPDATE herald.tasks t
SET run_at = CASE WHEN $3::timestamptz IS NOT NULL THEN $3::timestamptz
                  WHEN $4::bigint IS NOT NULL
                      THEN herald.now() + $4::bigint * interval '1 millisecond'
                  ELSE t.run_at END,
    content = CASE WHEN $5::boolean THEN $6::bytea ELSE t.content END,
    template_id = CASE WHEN $5::boolean THEN $7::text ELSE t.template_id END,
    priority = $8,
    expire_at = $9,
    labels = $10,
    max_attempts = $11,
    backoff_initial_ms = $12,
    backoff_max_ms = $13,
    backoff_multiplier = $14,
    backoff_jitter = $15,
    retry_delays_ms = CASE WHEN $16::text = '' THEN '{}'::bigint[]
                           ELSE string_to_array($16::text, ',')::bigint[] END,
    updated_at = herald.now()
WHERE t.id = $1 AND t.namespace = $2 AND t.state = 'scheduled' AND t.updated_at = $17
RETURNING {task_columns}
