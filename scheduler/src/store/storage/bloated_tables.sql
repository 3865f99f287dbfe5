-- Of the herald tables $1, those a rewrite (VACUUM FULL) would shrink to a small part of their
-- size: between $2 and $3 bytes on disk (heap, indexes and TOAST), with a heap at least $4
-- times what its live rows take. The live rows are counted as the larger of the statistics
-- system's running count (n_live_tup, kept as transactions commit) and the catalog's count as of
-- the last VACUUM or ANALYZE (reltuples): the running count starts again from zero after a
-- crash or a statistics reset, and a table full of live rows must not look empty then. Their
-- bytes are estimated from the planner statistics' average column widths plus a row header; a
-- table never analyzed counts 1 KiB a row. Only tables the session's role may rewrite (its own, or any for a superuser): for
-- another's, VACUUM only warns, and the table would look bloated, and be tried, every time.
SELECT b.table_name, b.bytes, b.heap_bytes, b.live_bytes
FROM (
    SELECT c.relname::text AS table_name,
           pg_total_relation_size(c.oid) AS bytes,
           pg_relation_size(c.oid) AS heap_bytes,
           (greatest(s.n_live_tup, c.reltuples, 0) * coalesce(w.width + 32, 1024))::bigint
               AS live_bytes
    FROM unnest($1::text[]) AS t(name)
    JOIN pg_class c ON c.oid = to_regclass('herald.' || quote_ident(t.name))
    JOIN pg_stat_user_tables s ON s.relid = c.oid
    LEFT JOIN LATERAL (
        SELECT sum(st.avg_width) AS width
        FROM pg_stats st
        WHERE st.schemaname = 'herald' AND st.tablename = c.relname
    ) w ON true
    WHERE pg_has_role(c.relowner, 'USAGE')
) b
WHERE b.bytes BETWEEN $2 AND $3
  AND b.heap_bytes >= $4::float8 * b.live_bytes
ORDER BY b.table_name
