-- Hands leases back without charging an attempt: they never reached an executor. Returns the
-- account of each, as '<namespace>/<account>', whose slot the caller frees in the same
-- transaction, and whether the lease was granted on the account's current local day: only then
-- does the caller give back its daily count too. A lease granted before the account's midnight
-- was counted on the day before; refunded after it, it came off the new day's count, and the
-- account could send that many more than its cap on the new day.
UPDATE herald.tasks t
SET state = 'scheduled', lease_expires_at = NULL, updated_at = herald.now()
FROM unnest(herald.opaque_to_planner($1::uuid[]), herald.opaque_to_planner($2::integer[]))
    AS l(id, attempt)
-- One primary-key probe per lease, whatever the statistics say (see extend_leases.sql).
WHERE t.id = l.id AND t.lease_count = l.attempt
  AND t.state::text = 'leased' AND t.namespace = $3
RETURNING t.namespace || '/' || t.account_id AS account,
          (SELECT (t.leased_at AT TIME ZONE a.time_zone)::date
                  = (herald.now() AT TIME ZONE a.time_zone)::date
           FROM herald.accounts a
           WHERE a.namespace = t.namespace AND a.id = t.account_id) AS counted_today
