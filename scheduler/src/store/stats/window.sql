-- Resolves a stats window by the database's clock (never a replica's). With $2 NULL: today in
-- time zone $1, from local midnight to the next local midnight, which is 23 or 25 hours long
-- across a daylight-saving change because the day is added in local time before converting
-- back. With $2 set: the $2 milliseconds ending now.
SELECT CASE WHEN $2::bigint IS NULL
            THEN date_trunc('day', herald.now() AT TIME ZONE $1::text) AT TIME ZONE $1::text
            ELSE herald.now() - $2::bigint * interval '1 millisecond' END AS window_start,
       CASE WHEN $2::bigint IS NULL
            THEN (date_trunc('day', herald.now() AT TIME ZONE $1::text) + interval '1 day')
                 AT TIME ZONE $1::text
            ELSE herald.now() END AS window_end
