-- Of the herald tables $1, those the compactor may rewrite (VACUUM FULL): between $2 and $3
-- bytes on disk (heap, indexes and TOAST), with what the compactor weighs (crate::compaction):
-- the heap's size, what its live rows take, what one row takes, and how many row versions the
-- table's updates and deletes have left dead so far (a running count the compactor samples each
-- round, to tell how many dead rows an open snapshot still holds). The live rows are counted as
-- the larger of the statistics system's running count (n_live_tup, kept as transactions commit)
-- and the catalog's count as of the last VACUUM or ANALYZE (reltuples): the running count starts
-- again from zero after a crash or a statistics reset, and a table full of live rows must not
-- look empty then. A row's bytes are estimated from the planner statistics' average column
-- widths plus a row header; a table never analyzed counts 1 KiB a row. Only tables the
-- session's role may rewrite (its own, or any for a superuser): for another's, VACUUM only
-- warns, and the table would look bloated, and be tried, every time.
SELECT b.table_name, b.bytes, b.heap_bytes,
       (b.live_rows * b.row_bytes)::bigint AS live_bytes, b.row_bytes, b.dead_versions
FROM (
    SELECT c.relname::text AS table_name,
           pg_total_relation_size(c.oid) AS bytes,
           pg_relation_size(c.oid) AS heap_bytes,
           greatest(s.n_live_tup, c.reltuples, 0) AS live_rows,
           coalesce(w.width + 32, 1024)::bigint AS row_bytes,
           (s.n_tup_upd + s.n_tup_del)::bigint AS dead_versions
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
ORDER BY b.table_name
