-- One notion of "now" for every statement and function of herald: herald.now() (the
-- transaction's time) and herald.clock() (the time at the call, for reservations taken under a
-- row lock). Both are the database clock plus a skew that only tests set, through
-- herald.set_test_clock(), to cover days and weeks of pacing in seconds of wall time. The skew
-- table is empty in production, so herald.now() is now().
CREATE TABLE herald.test_clock (
    id   boolean PRIMARY KEY DEFAULT true CHECK (id),
    skew interval NOT NULL
);

CREATE FUNCTION herald.now() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT now() + coalesce((SELECT skew FROM herald.test_clock), interval '0')
$$;

CREATE FUNCTION herald.clock() RETURNS timestamptz
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT clock_timestamp() + coalesce((SELECT skew FROM herald.test_clock), interval '0')
$$;

-- Sets the test clock's skew and tells every replica: their Rust clocks follow (herald_clock),
-- and dispatchers and the materialiser look again at once. For tests only.
CREATE FUNCTION herald.set_test_clock(p_skew interval) RETURNS timestamptz
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO herald.test_clock (id, skew) VALUES (true, p_skew)
    ON CONFLICT (id) DO UPDATE SET skew = EXCLUDED.skew;
    PERFORM pg_notify('herald_clock', (extract(epoch FROM p_skew) * 1000)::bigint::text);
    PERFORM pg_notify('herald_due', '0');
    PERFORM pg_notify('herald_schedules', '');
    RETURN herald.now();
END
$$;
