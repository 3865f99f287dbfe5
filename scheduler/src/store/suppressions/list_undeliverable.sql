-- Lists with reason 'invalid_recipient' the recipients of those tasks among $2 (namespace $1)
-- that ended because the provider says the recipient cannot receive messages at all (end
-- reason invalid_recipient: WhatsApp 131026, WeCom 81013), or all of them when $3 (the caller
-- read it from the provider's code of a failure after acceptance), noting the provider's
-- error; a recipient already listed keeps its entry. Returns those newly listed.
INSERT INTO herald.suppressions (namespace, recipient, reason, note)
SELECT DISTINCT ON (herald.recipient_key(t.recipient))
       t.namespace, herald.recipient_key(t.recipient),
       'invalid_recipient'::herald.suppression_reason,
       left('the provider cannot deliver to them: ' || coalesce(t.last_error, ''), 1024)
FROM herald.tasks t
WHERE t.namespace = $1 AND t.id = ANY($2::uuid[])
  AND (t.end_reason = 'invalid_recipient' OR $3::boolean)
ORDER BY herald.recipient_key(t.recipient)
ON CONFLICT (namespace, recipient) DO NOTHING
RETURNING recipient
