-- A page of an audience's contacts after recipient $3, by recipient, filtered: every tag of
-- $4 (an empty array holds for all), recipient prefix $5 (a range on the primary key: the
-- column's "C" collation orders by bytes), name containing $6 ignoring case.
SELECT {contact_columns} FROM herald.contacts
WHERE namespace = $1 AND audience_id = $2 AND recipient > $3
  AND tags @> $4::text[]
  AND ($5 = '' OR (recipient >= $5 AND left(recipient, length($5)) = $5))
  AND ($6 = '' OR strpos(lower(name), lower($6)) > 0)
ORDER BY recipient
LIMIT $7
