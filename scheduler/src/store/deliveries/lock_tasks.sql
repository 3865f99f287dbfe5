-- Serialises the transactions that decide whether a send of unknown outcome went out ($2,
-- namespace $1): a report batch making such a task wait for its callback (await_callbacks.sql)
-- and a webhook batch naming it (accept_awaiting.sql). Without it, each could miss the other's
-- uncommitted rows: the webhook finds the task still leased, the report finds no callback yet,
-- and the task waits the grace and is sent again although its message went out. Taken after
-- lock_messages.sql's locks, in a fixed order, like them.
SELECT count(pg_advisory_xact_lock(k)) AS locked
FROM (
    SELECT DISTINCT hashtextextended($1 || ':task:' || id::text, 0) AS k
    FROM unnest($2::uuid[]) AS id
    ORDER BY k
) keys
