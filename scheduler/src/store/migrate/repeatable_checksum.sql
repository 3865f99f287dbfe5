-- The checksum of the text of a repeatable migration applied last.
SELECT checksum FROM herald.schema_repeatables WHERE name = $1
