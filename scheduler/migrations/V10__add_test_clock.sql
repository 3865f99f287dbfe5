-- One notion of "now" for every statement and function of herald: herald.now() (the
-- transaction's time) and herald.clock() (the time at the call, for reservations taken under a
-- row lock). Both are the database clock plus a skew that only tests set, through
-- herald.set_test_clock(), to cover days and weeks of pacing in seconds of wall time. In
-- production the skew is zero and they are now() and clock_timestamp().
--
-- The skew is written into the functions' bodies as a literal rather than read from a table:
-- a body without a sub-select is inlined by the planner, so herald.now() costs what now() costs.
-- Reading a table there made every call a function call of its own, evaluated per row (measured:
-- a 500-task claim's index scan 16 times slower, its update a third slower). Replacing a function
-- invalidates the plans that inlined it, on every session. herald.test_clock keeps the skew for
-- the replicas' Rust clocks, which read it when they (re)connect.
CREATE TABLE herald.test_clock (
    id   boolean PRIMARY KEY DEFAULT true CHECK (id),
    skew interval NOT NULL
);

CREATE FUNCTION herald.now() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$ SELECT now() $$;

CREATE FUNCTION herald.clock() RETURNS timestamptz
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$ SELECT clock_timestamp() $$;

-- Sets the test clock's skew and tells every replica: their Rust clocks follow (herald_clock),
-- and dispatchers and the materialiser look again at once. For tests only.
CREATE FUNCTION herald.set_test_clock(p_skew interval) RETURNS timestamptz
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO herald.test_clock (id, skew) VALUES (true, p_skew)
    ON CONFLICT (id) DO UPDATE SET skew = EXCLUDED.skew;
    EXECUTE format(
        'CREATE OR REPLACE FUNCTION herald.now() RETURNS timestamptz '
        'LANGUAGE sql STABLE PARALLEL SAFE AS %L',
        format('SELECT now() + %L::interval', p_skew));
    EXECUTE format(
        'CREATE OR REPLACE FUNCTION herald.clock() RETURNS timestamptz '
        'LANGUAGE sql VOLATILE PARALLEL SAFE AS %L',
        format('SELECT clock_timestamp() + %L::interval', p_skew));
    PERFORM pg_notify('herald_clock', (extract(epoch FROM p_skew) * 1000)::bigint::text);
    PERFORM pg_notify('herald_due', '0');
    PERFORM pg_notify('herald_schedules', '');
    RETURN now() + p_skew;
END
$$;
