-- The size on disk of each herald table in $1, indexes and TOAST included; a partitioned
-- table's is the sum of its partitions' (the parent itself holds nothing). Read from the files'
-- sizes, so it costs the same however bloated a table is. A partition that retention drops
-- meanwhile counts as nothing (pg_total_relation_size is NULL for a table that is gone).
SELECT w.name AS table_name,
       (coalesce(pg_total_relation_size(c.oid), 0)
        + coalesce((SELECT sum(pg_total_relation_size(i.inhrelid))
                    FROM pg_inherits i WHERE i.inhparent = c.oid), 0))::bigint AS bytes
FROM unnest($1::text[]) WITH ORDINALITY AS w(name, ord)
JOIN pg_class c ON c.oid = to_regclass('herald.' || quote_ident(w.name))
ORDER BY w.ord
