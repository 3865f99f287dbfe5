-- How long the oldest transaction on herald's database has been open, in seconds (0 when none
-- is), counting only those that keep VACUUM from removing row versions: sessions holding a
-- snapshot or a transaction id, and prepared transactions (from their preparation). While one
-- is open, no version that became dead after it began can be reclaimed in any herald table
-- (docs/operations.md). Not counted: this session, automatic vacuum workers (VACUUM does not
-- hold back another VACUUM), and replication slots (they hold no transaction; see
-- pg_replication_slots). Other roles' sessions show their transactions only to a superuser or
-- a member of pg_read_all_stats (`sees_every_role`).
WITH oldest AS (
    SELECT a.xact_start AS began
    FROM pg_stat_activity a
    WHERE a.datname = current_database()
      AND a.pid <> pg_backend_pid()
      AND a.backend_type <> 'autovacuum worker'
      AND (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)
    UNION ALL
    SELECT p.prepared FROM pg_prepared_xacts p WHERE p.database = current_database()
)
SELECT coalesce(extract(epoch FROM clock_timestamp() - min(began)), 0)::float8 AS seconds,
       pg_has_role(current_user, 'pg_read_all_stats', 'USAGE') AS sees_every_role
FROM oldest
