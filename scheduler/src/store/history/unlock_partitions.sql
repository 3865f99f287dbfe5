-- Gives back the lock lock_partitions.sql took.
SELECT pg_advisory_unlock(7526744137461661953) AS unlocked
