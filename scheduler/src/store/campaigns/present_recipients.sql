-- Which of the recipients $2 the campaign already has.
SELECT recipient FROM herald.tasks WHERE campaign_id = $1 AND recipient = ANY($2)
