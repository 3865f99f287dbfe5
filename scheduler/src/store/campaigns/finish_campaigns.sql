-- Marks campaigns whose every task has ended as finished and raises `campaign.finished` (see
-- herald.finish_campaigns, migration V8).
SELECT herald.finish_campaigns() AS finished
