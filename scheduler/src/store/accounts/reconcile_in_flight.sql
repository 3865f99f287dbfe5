-- Sets a locked account's in-flight count to the leases it holds (a fresh snapshot: see
-- lock_account.sql), keeping the releases still waiting in account_deltas on top, since their
-- fold will take them off again. The leases and the waiting releases are read in one snapshot:
-- a report commits its tasks' ends and its deltas together, so each ended lease is either
-- uncounted and waiting, or counted and not yet written. Returns the count before, when it
-- changed.
UPDATE herald.accounts a
SET in_flight = live.n + waiting.n
FROM (SELECT count(*)::integer AS n FROM herald.tasks t
      WHERE t.account_id = $2 AND t.namespace = $1 AND t.state = 'leased') live,
     (SELECT coalesce(sum(d.released), 0)::integer AS n FROM herald.account_deltas d
      WHERE d.namespace = $1 AND d.account_id = $2) waiting,
     (SELECT herald.account_in_flight(x) AS before FROM herald.accounts x
      WHERE x.namespace = $1 AND x.id = $2) old
WHERE a.namespace = $1 AND a.id = $2 AND a.in_flight <> live.n + waiting.n
RETURNING old.before, live.n AS after
