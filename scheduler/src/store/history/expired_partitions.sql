-- The history partition pairs holding only tasks that ended more than $1 ms ago, oldest first.
SELECT suffix FROM herald.history_partitions
WHERE upper <= herald.now() - $1::bigint * interval '1 millisecond'
ORDER BY lower
