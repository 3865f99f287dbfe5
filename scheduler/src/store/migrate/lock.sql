-- Serialises migrations across replicas starting at once. Session level: held across the
-- migration transactions, released even on a crash because the connection closes.
SELECT pg_advisory_lock($1)
