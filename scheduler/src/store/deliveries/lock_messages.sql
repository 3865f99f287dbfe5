-- Serialises the transactions that touch the same provider messages ($2, namespace $1): a
-- report batch naming a message id and a webhook batch reporting on it. Without it, each could
-- miss the other's uncommitted rows: a failure recorded while the send's report is being
-- applied would find the task still leased, and the report would not see the failure, so the
-- task would stay SUCCEEDED. Transaction-scoped advisory locks, taken in a fixed order.
SELECT count(pg_advisory_xact_lock(k)) AS locked
FROM (
    SELECT DISTINCT hashtextextended($1 || ':' || id, 0) AS k
    FROM unnest($2::text[]) AS id
    ORDER BY k
) keys
