-- Sets a locked account's in-flight count to the leases it holds (a fresh snapshot: see
-- lock_account.sql). Returns the count before, when it changed.
UPDATE herald.accounts a
SET in_flight = live.n
FROM (SELECT count(*)::integer AS n FROM herald.tasks t
      WHERE t.account_id = $2 AND t.namespace = $1 AND t.state = 'leased') live,
     (SELECT in_flight AS before FROM herald.accounts WHERE namespace = $1 AND id = $2) old
WHERE a.namespace = $1 AND a.id = $2 AND a.in_flight <> live.n
RETURNING old.before, a.in_flight AS after
