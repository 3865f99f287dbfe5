-- Releases the migration lock.
SELECT pg_advisory_unlock($1)
