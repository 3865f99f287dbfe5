-- Takes, without waiting, the lock that serialises partition changes across replicas (the
-- key herald.ensure_history_partitions takes per transaction), for this session.
SELECT pg_try_advisory_lock(7526744137461661953) AS locked
