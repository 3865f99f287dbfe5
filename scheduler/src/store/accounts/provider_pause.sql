-- Takes account $2 (namespace $1) out of rotation because its provider disabled or restricted
-- it: PAUSED with reason $3, raising `account.paused`. An account already paused keeps its
-- reason, so a repeated event raises nothing and an operator's pause stays the operator's.
-- Returns the account when it was paused now.
WITH paused AS (
    UPDATE herald.accounts
    SET state = 'paused', state_reason = $3, updated_at = herald.now()
    WHERE namespace = $1 AND id = $2 AND state <> 'paused'
    RETURNING namespace, id, pool, state_reason
)
SELECT p.id
FROM paused p
CROSS JOIN LATERAL herald.notify_event('account.paused', jsonb_build_object(
    'namespace', p.namespace, 'account_id', p.id, 'pool', p.pool,
    'reason', p.state_reason)) AS n
