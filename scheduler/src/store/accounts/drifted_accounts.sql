-- Accounts whose in-flight count (less the releases waiting to be folded in) differs from the
-- leases they hold now. Read without locks, so a claim or report in progress can show up here;
-- reconcile_in_flight.sql decides under the account's lock. The leases are counted in one pass
-- over the leased tasks (tasks_lease_expiry holds only those), not per account.
WITH held AS (
    SELECT t.namespace, t.account_id, count(*)::integer AS n
    FROM herald.tasks t
    WHERE t.state = 'leased' AND t.account_id IS NOT NULL
    GROUP BY t.namespace, t.account_id
)
SELECT a.namespace, a.id
FROM herald.accounts a
LEFT JOIN held h ON h.namespace = a.namespace AND h.account_id = a.id
WHERE herald.account_in_flight(a) <> coalesce(h.n, 0)
