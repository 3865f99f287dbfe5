-- Upserts a batch of contacts by recipient (the batch holds each recipient once). Tags travel
-- as one JSON array per contact: unnest cannot take an array of arrays of different lengths.
-- `xmax = 0` tells a row this statement created from one it updated.
WITH written AS (
    INSERT INTO herald.contacts AS c (namespace, audience_id, recipient, name, time_zone,
                                      locale, tags, attributes)
    SELECT $1, $2, i.recipient, i.name, i.time_zone, i.locale,
           ARRAY(SELECT jsonb_array_elements_text(i.tags)), i.attributes
    FROM unnest($3::text[], $4::text[], $5::text[], $6::text[], $7::jsonb[], $8::jsonb[])
         AS i(recipient, name, time_zone, locale, tags, attributes)
    ON CONFLICT (namespace, audience_id, recipient) DO UPDATE
    SET name = EXCLUDED.name, time_zone = EXCLUDED.time_zone, locale = EXCLUDED.locale,
        tags = EXCLUDED.tags, attributes = EXCLUDED.attributes, updated_at = now()
    RETURNING (xmax = 0) AS created
)
SELECT count(*) FILTER (WHERE created) AS created, count(*) AS written FROM written
