-- Records the provider's view of account $2: its quality rating ($3, NULL keeps it) and its
-- messaging tier ($4 says whether $5 replaces the tier limit). A new tier is recounted at once.
UPDATE herald.accounts
SET quality = COALESCE($3, quality),
    tier_limit = CASE WHEN $4 THEN $5 ELSE tier_limit END,
    tier_counted_at = CASE WHEN $4 THEN NULL ELSE tier_counted_at END,
    updated_at = herald.now()
WHERE namespace = $1 AND id = $2
