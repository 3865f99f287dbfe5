-- Applies a batch's feedback, one array element per account (see herald.account_feedback in
-- functions.sql). True when an account at its in-flight limit got room back.
SELECT herald.account_feedback($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) AS freed
