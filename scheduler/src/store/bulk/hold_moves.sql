-- Keeps the retention job from moving tasks into the history while a bulk batch is chosen,
-- and waits for a move under way to commit: the key is archive_tasks.sql's, which the move
-- only tries, so it skips its pass while any batch holds this. Without it a task deleted from
-- the hot table by an uncommitted move was skipped by the batch's locking read and not yet in
-- the history its second read looked at: the cursor passed it, never retried, and a batch
-- that found nothing else marked the operation done. A statement of its own, so that the batch
-- takes its snapshot once the move has committed.
SELECT pg_advisory_xact_lock_shared(7526744137461661954)
