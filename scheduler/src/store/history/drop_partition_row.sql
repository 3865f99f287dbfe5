-- Forgets partition pair $1, once both its tables are dropped.
DELETE FROM herald.history_partitions WHERE suffix = $1
