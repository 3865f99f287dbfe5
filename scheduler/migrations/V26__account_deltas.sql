-- Released slots and successes waiting to be folded into their account row (#18, S5). A report
-- batch used to update every account it sent for, and so waited for, and held up, the claims
-- reserving on the same rows. Now a batch whose outcomes only free slots and count successes
-- appends one row per account here, in the transaction that ends the leases, and takes no
-- account lock; every read of an account's in-flight count subtracts what is waiting
-- (herald.account_in_flight), and herald.fold_account_deltas applies the rows under the
-- account's lock and deletes them. Anything else a report says (rate limited, unavailable,
-- failed, a daily refund) is still applied to the row at once.
CREATE TABLE herald.account_deltas (
    namespace  text NOT NULL,
    account_id text NOT NULL,
    -- In-flight slots the batch freed.
    released   integer NOT NULL,
    -- Successful sends, for the adaptive rate and the recent success rate.
    ok         integer NOT NULL
);
-- No foreign key: checking it would share-lock the account row the claims hold.

-- Read per account by every claim's room and deleted by the fold.
CREATE INDEX account_deltas_account ON herald.account_deltas (namespace, account_id);

-- Rows live for well under a second and the table stays a few pages: vacuum after a fixed
-- number of dead rows, as for herald.accounts.
ALTER TABLE herald.account_deltas SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 5000,
    autovacuum_analyze_scale_factor = 0.2,
    autovacuum_vacuum_cost_delay = 0
);
