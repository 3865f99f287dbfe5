-- Deletes the delivery reports and guard rows of partition pair $1's tasks (see
-- herald.forget_history_partition); returns how many tasks the pair holds.
SELECT herald.forget_history_partition($1) AS tasks
