-- Accounts whose in-flight count (less the releases waiting to be folded in) differs from the
-- leases they hold now. Read without locks, so a claim or report in progress can show up here;
-- reconcile_in_flight.sql decides under the account's lock. Uses tasks_account_live (live tasks
-- by account).
SELECT a.namespace, a.id
FROM herald.accounts a
WHERE herald.account_in_flight(a) <> (SELECT count(*) FROM herald.tasks t
                                      WHERE t.account_id = a.id AND t.namespace = a.namespace
                                        AND t.state = 'leased')
