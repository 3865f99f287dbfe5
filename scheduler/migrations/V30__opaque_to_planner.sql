-- Returns its argument, which the planner cannot see through: a statement that wraps a
-- parameter in it is estimated alike whether planned for the parameter's value (a custom plan)
-- or for any value (the generic plan). PostgreSQL keeps re-planning a prepared statement at
-- every execution while its custom plans look cheaper than the generic one. next_due did that
-- (one route looks ten times cheaper than the generic plan's ten): 2-3 ms of CPU on every idle
-- wake-up of every dispatcher; so did a report of a few results, 0.8 ms each (docs/
-- performance.md, S3). VOLATILE, because the planner folds even a STABLE function's value into
-- its estimates; so only for a set-returning function's argument in FROM, never inside an
-- index condition (a volatile value cannot be one).
CREATE FUNCTION herald.opaque_to_planner(p anyarray) RETURNS anyarray
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN p;
END
$$;
