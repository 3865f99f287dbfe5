-- Gives account $2 (namespace $1) back to rotation when its provider reconnected it: ACTIVE
-- with reason $3, but only when the provider's own pause (reason starting with $4) is what
-- holds it; an operator's pause or a self-pause stays.
UPDATE herald.accounts
SET state = 'active', state_reason = $3, updated_at = herald.now()
WHERE namespace = $1 AND id = $2 AND state = 'paused' AND starts_with(state_reason, $4)
