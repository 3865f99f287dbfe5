-- Which of the tables $1 (names in schema herald) are still partitions, and whether a detach of
-- each was started and not finished (an interrupted DETACH ... CONCURRENTLY).
SELECT c.relname::text AS name, i.inhdetachpending AS detach_pending
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
WHERE c.relnamespace = 'herald'::regnamespace AND c.relname = ANY ($1::text[])
