-- Takes transaction-scoped advisory locks on the duplicate content guard's keys $1 (sorted by
-- the caller, so overlapping sets are locked in the same order): two transactions creating the
-- same message are ordered, and the second sees the first's guard row.
SELECT count(pg_advisory_xact_lock(k)) AS locked FROM unnest($1::bigint[]) AS k
