-- Locks an unfinished fan-out for writing a batch, with the database clock. SKIP LOCKED: a
-- replica writing the same batch now wins and this one leaves it alone.
SELECT after_recipient, herald.now() AS db_now FROM herald.fanouts
WHERE namespace = $1 AND schedule_id = $2 AND fire_time = $3 AND NOT done
FOR UPDATE SKIP LOCKED
