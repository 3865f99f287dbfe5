-- Locks the campaigns of tasks $1 for the rest of the transaction, before a path that brings
-- ended tasks back to life (a retry) reads their campaign's state: a pause or cancel that
-- commits first is seen by the retry's next statement, and one that comes after waits for the
-- retry and then finds the task live, so neither misses it. NO KEY UPDATE rather than SHARE: a
-- retry may reopen a finished campaign (an update), and two share holders both upgrading
-- would deadlock. Tasks still in the history count (a retry brings them back after). In
-- campaign id order, so transactions that take several (a bulk retry takes
-- its whole batch's at once) take them in the same order.
SELECT c.id FROM herald.campaigns c
WHERE c.id IN (SELECT t.campaign_id FROM herald.tasks t WHERE t.id = ANY($1::uuid[])
               UNION ALL
               SELECT h.campaign_id FROM herald.task_history h WHERE h.id = ANY($1::uuid[]))
ORDER BY c.id
FOR NO KEY UPDATE OF c
