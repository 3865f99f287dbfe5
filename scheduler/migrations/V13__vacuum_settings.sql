-- Storage settings for the tables herald changes all day (#18). PostgreSQL's defaults vacuum a
-- table once a fifth of it is dead and analyse it once a tenth changed: for a tasks table of
-- ten million rows that is two million dead rows carried before a vacuum, and plans computed
-- from statistics hours old. herald's tables churn at a steady rate instead, so they are
-- vacuumed and analysed after a fixed, small share of changes.

-- Every task is inserted, leased, finished and pruned; none of its state changes is a HOT
-- update (the due, lease-expiry and finished indexes are partial on the state), so dead rows
-- come at several per task. Vacuum after 1 % of the table plus a thousand rows, analyse after
-- 2 %, and also after inserts alone (1 %), so the visibility map and the plans keep up.
ALTER TABLE herald.tasks SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.02,
    -- Autovacuum's default cost limit pauses it after a few hundred pages; a hot queue
    -- table needs it to finish in one go.
    autovacuum_vacuum_cost_delay = 0
);

-- Attempts are appended and pruned with their task.
ALTER TABLE herald.attempts SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.05,
    autovacuum_vacuum_cost_delay = 0
);

-- A few rows updated by every claim and every report batch: thousands of row versions a
-- second. Half of each page is kept free so a new version stays on its page (a HOT update, no
-- index entry; no indexed column of an account changes on those paths) and page pruning
-- reclaims the old ones without waiting for vacuum. Vacuumed after a fixed number of dead rows,
-- since a fifth of a hundred-row table is no measure.
ALTER TABLE herald.accounts SET (
    fillfactor = 50,
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_analyze_scale_factor = 0.2,
    autovacuum_vacuum_cost_delay = 0
);

-- One row per (account, recipient), updated at every send to the pair (last_sent_at is
-- indexed for retention, so these updates are not HOT).
ALTER TABLE herald.recipient_sends SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.05,
    autovacuum_vacuum_cost_delay = 0
);
