-- One page of FAILED and EXPIRED tasks that ended in [$2, $3), newest first, with their last
-- attempt. Every filter is a parameter that may be NULL, so one prepared statement serves all.
SELECT t.id, t.queue, t.recipient, t.template_id, t.content, t.labels,
       t.state::text AS state, last.outcome,
       coalesce(last.error, t.last_error) AS error,
       -- A task that expired before any attempt still names the account it was pinned to.
       coalesce(last.account, t.account_id) AS account,
       t.attempts, t.finished_at
FROM herald.task_records t
LEFT JOIN LATERAL (
    SELECT a.outcome, a.error, a.account
    FROM herald.attempt_records a
    WHERE a.task_id = t.id
    ORDER BY a.attempt DESC
    LIMIT 1
) last ON true
WHERE t.namespace = $1
  AND t.state IN ('failed', 'expired')
  AND t.finished_at >= $2 AND t.finished_at < $3
  AND ($4::text IS NULL OR t.queue = $4)
  AND ($5::text IS NULL OR coalesce(last.account, t.account_id) = $5)
  AND ($6::smallint IS NULL OR last.outcome = $6)
  AND ($7::text IS NULL OR t.template_id = $7)
  -- Keyset paging: strictly after the previous page's last row in (finished_at, id) DESC
  -- order, so rows ending meanwhile never shift a page.
  AND ($8::timestamptz IS NULL OR (t.finished_at, t.id) < ($8, $9::uuid))
ORDER BY t.finished_at DESC, t.id DESC
LIMIT $10
