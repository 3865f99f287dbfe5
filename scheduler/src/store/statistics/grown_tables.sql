-- Of the herald tables $1, those holding at least $3 live rows and more than $2 times the rows
-- their statistics last counted (pg_class.reltuples, -1 before a table's first ANALYZE).
-- n_live_tup is the cumulative statistics system's running count, kept as transactions commit.
-- Only tables the session's role may analyze (its own, or any for a superuser): for another's,
-- ANALYZE only warns, and the table would look grown, and be tried, every second.
SELECT c.relname::text AS table_name
FROM unnest($1::text[]) AS w(name)
JOIN pg_class c ON c.oid = to_regclass('herald.' || quote_ident(w.name))
JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE pg_has_role(c.relowner, 'USAGE')
  AND s.n_live_tup >= $3
  AND s.n_live_tup > $2::float8 * greatest(c.reltuples, 0)
ORDER BY c.relname
