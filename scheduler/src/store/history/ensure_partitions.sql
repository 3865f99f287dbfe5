-- Makes the history partitions for tasks ending from $1 ms ago to $2 ms ahead, $3 ms wide,
-- waiting at most $4 ms for the tables' locks.
SELECT herald.ensure_history_partitions(
    herald.now() - $1::bigint * interval '1 millisecond',
    herald.now() + $2::bigint * interval '1 millisecond',
    $3::bigint * interval '1 millisecond',
    $4::bigint * interval '1 millisecond') AS made
