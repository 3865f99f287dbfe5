-- The LEASED tasks of namespace $1 to the recipients $2, or to another name a provider knows
-- one of them by (herald.recipient_aliases_of), compared as the suppression list does: what a
-- new suppression must still stop, since the claim checks the list only before it leases.
-- Run after the suppression is written. SCHEDULED tasks to them are locked too, and the rows
-- re-read once free: a claim that checked the list before the suppression and has locked a
-- task but not committed its lease is waited for and its lease found (a plain read saw the
-- task still SCHEDULED and let the send through); and while this transaction holds them, no
-- claim takes them before the suppression is visible to it. The claim skips locked rows.
-- Scheduled tasks are found through tasks_recipient by either spelling, leased ones through
-- tasks_lease_expiry (a few thousand at most).
WITH keys AS (
    SELECT ARRAY(SELECT herald.recipient_key(r) FROM unnest($2::text[]) AS r) AS listed
),
names AS (
    SELECT k.listed || ARRAY(SELECT o.other FROM herald.recipient_aliases_of($1, k.listed) o)
        AS all_names
    FROM keys k
),
spellings AS (
    SELECT n.all_names || ARRAY(SELECT '+' || x FROM unnest(n.all_names) AS x) AS any_spelling
    FROM names n
)
SELECT t.id, t.state::text AS state
FROM herald.tasks t, spellings s
WHERE t.namespace = $1
  AND ((t.state = 'scheduled' AND t.recipient = ANY(s.any_spelling))
       OR (t.state = 'leased' AND t.lease_expires_at IS NOT NULL
           AND t.recipient = ANY(s.any_spelling)))
FOR UPDATE OF t
