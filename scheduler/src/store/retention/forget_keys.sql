-- Forgets idempotency keys whose retention is over.
DELETE FROM herald.idempotency_keys WHERE forget_after IS NOT NULL AND forget_after < herald.now()
